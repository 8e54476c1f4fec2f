"""A live run's directory is its own: the launcher holds a lock beside it (`.<name>.lock` in the same folder:
it survives --force emptying the directory) with its PID, host and start time, from before the directory
is prepared to after the run is loaded.

A second launch into the same directory — with or without --force — is refused while the first is alive,
naming its PID and host (on another host the PID cannot be looked at: the lock is believed). A lock left by
a run that died (its PID gone on this host) is taken over, with a note. A multi-machine run's second agent
on one host joins its run (launcher._joins) without the lock. No torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

from workbench.config import ConfigError


def lock_path(run_dir: str) -> str:
    parent, name = os.path.split(os.path.abspath(run_dir).rstrip(os.sep))
    return os.path.join(parent, f".{name}.lock")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class RunLock:
    """`acquire(run_dir)` or ConfigError naming the live owner; `release()` (idempotent) when done."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def acquire(cls, run_dir: str) -> RunLock:
        path = lock_path(run_dir)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mine = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "run_dir": run_dir,
        }
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                cls._take_over_or_refuse(path, run_dir)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(mine, f)
            return cls(path)
        raise ConfigError(
            f"{run_dir}: another launch took its lock ({path}) at the same moment; try again"
        )

    @staticmethod
    def _take_over_or_refuse(path: str, run_dir: str) -> None:
        """A lock is there: refuse if its run lives; else remove it (a note says whose it was)."""
        try:
            with open(path) as f:
                owner = json.load(f)
        except (OSError, ValueError):
            owner = {}
        pid, host = owner.get("pid"), owner.get("host")
        here = host == socket.gethostname()
        if isinstance(pid, int) and (not here or _alive(pid)):
            since = time.strftime("%H:%M:%S", time.localtime(owner.get("started", 0)))
            where = "this host" if here else f"host {host} (its PID cannot be checked from here)"
            raise ConfigError(
                f"{run_dir} is being written by a live run: PID {pid} on {where}, since {since}; "
                f"--force does not replace a live run — wait for it, stop it, or choose another out= "
                f"(the lock: {path})"
            )
        print(
            f"[workbench] {run_dir}: taking over the lock of a run that is gone (PID {pid} on {host})",
            file=sys.stderr,
            flush=True,
        )
        os.remove(path)

    def release(self) -> None:
        try:
            with open(self.path) as f:
                if json.load(f).get("pid") != os.getpid():
                    return
            os.remove(self.path)
        except (OSError, ValueError):
            pass
