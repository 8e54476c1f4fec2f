"""No process of a run outlives the one that started it (no torch here).

`launch()` starts torchrun with a parent-death signal (Linux's prctl PR_SET_PDEATHSIG): if the Python
process that launched it dies — SIGKILL included, or a Jupyter kernel that is shut down — torchrun gets
SIGTERM, which makes it stop its ranks. The ranks set the same signal on themselves, so a torchrun that
is itself killed takes them along. `stop()` ends torchrun politely (SIGTERM: the ranks write their traces
and error files), then forcibly after a grace period.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Protocol


class Torchrun(Protocol):
    """A started torchrun, followed and stopped: a subprocess.Popen, or a WarmTorchrun
    (launching/warm_torchrun.py) forked from a process that has imported torch already."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def stop(proc: Torchrun, grace_s: float = 30.0) -> None:
    """SIGTERM to torchrun (it stops its ranks, which write what they have), SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
