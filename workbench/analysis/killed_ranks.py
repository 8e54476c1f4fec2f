"""Ranks that ended before any handler ran — SIGKILL above all, which is what the kernel's out-of-memory killer
sends. Such a rank writes no error file; its peers then fail at their next collective (a `CommError`) or are
stopped by torchrun (SIGTERM), and each of those writes one. Without this, the first error file on disk would be
named as the cause: a peer's broken connection instead of the rank the kernel killed.

How it is known: every rank reserves its error file first thing (`.error_rank<r>.reserved`, trace/disk.py) and
removes the reservation only when it ends well; a failed run's reservation with no error file is a rank that ran no
handler. Which signal: torchrun's summary (torch.distributed.elastic's ChildFailedError, at the end of the run's
launcher.log) gives a failed rank's exit code — a negative one is the signal — when it observed that rank's exit (it
lists the first failure it observed, which is not always the killed rank's). Whether the out-of-memory killer sent
it: the kernel's log (`dmesg`), where it can be read. The launcher writes an error file for each such rank
(`record_killed`), so that `RunFailed`, `workbench doctor` and a later reader all name it. No torch.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass

from workbench.trace.disk import write_error_file

_FAILURE = re.compile(
    r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)"
)


@dataclass(kw_only=True)
class Killed:
    rank: int
    signal: int | None  # from torchrun's summary; None where it did not observe this rank's exit
    pid: int | None
    # the kernel's log names its pid (True), does not (False), or cannot be read (None)
    out_of_memory: bool | None
    last_seen: float = 0.0  # wall-clock time of its last trace flush

    def describe(self) -> str:
        if self.signal is None:
            what = (
                f"rank {self.rank} ended without running any handler (no error file): killed by a signal none "
                f"can catch, SIGKILL"
            )
        else:
            name = (
                signal.Signals(self.signal).name
                if self.signal in set(signal.Signals)
                else f"signal {self.signal}"
            )
            what = f"rank {self.rank} was killed by {name} (exit code {-self.signal}, pid {self.pid}): no handler ran"
        if self.out_of_memory:
            return f"{what}. The kernel's log says its out-of-memory killer ended it: the run did not fit in memory"
        if self.signal in (None, signal.SIGKILL):
            why = (
                "its pid is not known, so the kernel's log was not searched"
                if self.pid is None
                else "the kernel's log cannot be read here"
                if self.out_of_memory is None
                else "nothing in the kernel's log that can be read here names it"
            )
            return (
                f"{what} — the kernel's out-of-memory killer sends SIGKILL ({why}), and so does torchrun to a "
                f"rank still stuck after its grace period, or something outside the run"
            )
        return what


def unreported_ranks(run_dir: str, world_size: int, since: float = 0.0) -> list[int]:
    """Ranks of this launch (below `world_size`, reserved at or after `since`, a wall-clock time) whose error-file
    reservation is still there with no error file: they ran no handler. An earlier attempt's (an elastic run that
    shrank) or an earlier launch's reservation is not this launch's rank."""
    ranks = []
    for path in glob.glob(os.path.join(run_dir, ".error_rank*.reserved")):
        m = re.search(r"error_rank(\d+)\.reserved", path)
        if m is None:  # the glob's * matched something other than a rank's number
            continue
        rank = int(m.group(1))
        if rank >= world_size or os.path.getmtime(path) < since:
            continue
        if not os.path.exists(os.path.join(run_dir, f"error_rank{rank}.json")):
            ranks.append(rank)
    return sorted(ranks)


def torchrun_signals(launcher_log: str) -> dict[int, tuple[int, int]]:
    """rank → (signal, pid) of every rank torchrun's summary reports ended by a signal."""
    return {
        int(r): (-int(code), int(pid))
        for r, code, pid in _FAILURE.findall(launcher_log)
        if int(code) < 0
    }


def killed_ranks(
    run_dir: str,
    launcher_log: str,
    world_size: int,
    since: float = 0.0,
    read_kernel_log: bool = True,
) -> list[Killed]:
    """The ranks of a failed launch that ended before any handler ran, with what is known of why; each stamped with
    the last time it wrote its trace stream (its last sign of life), so that it sorts among the error files."""
    ranks = unreported_ranks(run_dir, world_size, since)
    if not ranks:
        return []
    signals = torchrun_signals(launcher_log)
    kernel = kernel_log() if read_kernel_log else None
    out = []
    for rank in ranks:
        sig, pid = signals.get(rank, (None, None))
        killed = Killed(
            rank=rank,
            signal=sig,
            pid=pid,
            out_of_memory=None if kernel is None or pid is None else oom_killed(kernel, pid),
        )
        stream = os.path.join(run_dir, f"trace_rank{rank}.partial.jsonl")
        killed.last_seen = os.path.getmtime(stream) if os.path.exists(stream) else time.time()
        out.append(killed)
    return out


def record_killed(run_dir: str, killed: Killed) -> None:
    """The error file the rank could not write, into its reservation: its first line names the cause."""
    reserved = os.path.join(run_dir, f".error_rank{killed.rank}.reserved")
    write_error_file(
        os.path.join(run_dir, f"error_rank{killed.rank}.json"),
        reserved,
        {
            "rank": killed.rank,
            "time": killed.last_seen,
            "type": "Killed",
            "message": killed.describe(),
            "traceback": "",
            "coords": None,
            "secondary": False,
            "last_collectives": [],
            "signal": killed.signal,
            "pid": killed.pid,
            "out_of_memory": killed.out_of_memory,
        },
    )


def kernel_log() -> str | None:
    """The kernel's ring buffer (dmesg), or None where it cannot be read (a container, no permission)."""
    try:
        done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def oom_killed(kernel: str, pid: int) -> bool:
    """Whether a line of the out-of-memory killer's names the pid ("Out of memory: Killed process 1234 (python)",
    "oom-kill:...,pid=1234,...")."""
    return re.search(rf"(Killed process {pid}\b|\bpid={pid}\b)", kernel, re.IGNORECASE) is not None
