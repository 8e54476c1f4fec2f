"""torchrun, imported once: a launch forks torchrun's agent from a process that has already imported it.

`python -m torch.distributed.run` spends over a second importing torch before it starts a rank (on two
cores: 1.9 s for torchrun to run an empty script, 0.02 s for python to) — about a third of a short
run's launch, paid again by every launch of a notebook or a test suite. With warm launches on, the first
launch of a process starts this server (`python -m workbench.launching.warm_torchrun`, which dies with that
process); it imports torch.distributed.run once, and for each launch forks a child that *is* torchrun:
`torch.distributed.run.main(argv)` with the launch's arguments, environment, working directory and log
file — the same agent, rendezvous, restarts and signal handling as the command line's, without the
import. Its ranks are started by that agent: CPU ranks forked from it (`forked_ranks`: torchrun's own
`--run-path --start-method fork`, so a rank has torch imported already — 0.7 s for a 6-step dp = 2 run
instead of 2.6 s, measured on two cores), CUDA ranks as new interpreters, as the command line starts them
(a process must not fork after CUDA is initialised; a fresh rank never inherits such a state).

On when: `WORKBENCH_WARM_TORCHRUN=1` (the test suite and its notebooks set it), or a Jupyter kernel
(each launch of a notebook); `=0` turns it off; never where fork is missing (Windows), from a thread other
than the main one (the server's parent-death signal follows the thread that started it), or when the
agent's output goes to the terminal.

Protocol (JSON lines): the launcher writes {"id", "argv", "env", "cwd", "log"} to the server's stdin; the
server answers {"id", "pid"} when it has forked, and {"pid", "rc"} when that child has ended. The server
is single-threaded, so a fork never copies a lock another thread holds.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
from typing import Any

from workbench.launching.lifetime import die_with_parent

ENV = "WORKBENCH_WARM_TORCHRUN"


def wanted() -> bool:
    """Warm launches here: asked for (ENV=1), or in a Jupyter kernel unless ENV=0 — and possible."""
    setting = os.environ.get(ENV, "")
    if (
        setting == "0"
        or not hasattr(os, "fork")
        or threading.current_thread() is not threading.main_thread()
    ):
        return False
    return setting == "1" or "ipykernel" in sys.modules


class _Server:
    """The launcher's side of one server process: starts it, sends requests, collects answers."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workbench.launching.warm_torchrun"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            preexec_fn=die_with_parent,
        )
        if self.proc.stdin is None or self.proc.stdout is None:  # both asked for as pipes above
            raise RuntimeError("workbench.launching.warm_torchrun: the server has no pipes")
        self.requests, self.answers = self.proc.stdin, self.proc.stdout
        self.pids: dict[int, int] = {}  # request id → pid
        self.codes: dict[int, int] = {}  # pid → exit code
        self.changed = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True, name="warm-torchrun").start()

    def _read(self) -> None:
        for line in self.answers:
            msg = json.loads(line)
            with self.changed:
                if "rc" in msg:
                    self.codes[msg["pid"]] = msg["rc"]
                else:
                    self.pids[msg["id"]] = msg["pid"]
                self.changed.notify_all()
        with self.changed:  # the server is gone: nothing more will come
            self.changed.notify_all()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, argv: list[str], env: dict[str, str], log: str) -> int:
        with self.changed:
            self.next_id += 1
            rid = self.next_id
        request = {"id": rid, "argv": argv, "env": env, "cwd": os.getcwd(), "log": log}
        self.requests.write((json.dumps(request) + "\n").encode())
        self.requests.flush()
        with self.changed:
            self.changed.wait_for(lambda: rid in self.pids or not self.alive(), timeout=60)
            if rid not in self.pids:
                raise RuntimeError(
                    "workbench.launching.warm_torchrun: the server did not start torchrun"
                )
            return self.pids.pop(rid)


_server: _Server | None = None


def forked_ranks(argv: list[str]) -> list[str]:
    """torchrun's arguments with its ranks forked from its agent instead of started as new interpreters:
    `--run-path --start-method fork` and the rank module's file (torchrun's own options: it then runs the
    script with runpy in each rank it forks). The agent, forked from the server, has torch imported, so a
    rank starts in milliseconds instead of importing torch again (~2 s on two cores, measured: most of a
    short run's launch). Only `-m MODULE ...` at the end is rewritten; anything else is left as it was."""
    import importlib.util

    if len(argv) < 2 or "-m" not in argv:
        return argv
    i = argv.index("-m")
    spec = importlib.util.find_spec(argv[i + 1])
    if spec is None or spec.origin is None:
        return argv
    return [*argv[:i], "--run-path", "--start-method", "fork", spec.origin, *argv[i + 2 :]]


class WarmTorchrun:
    """torchrun forked from the server, followed like a subprocess.Popen (poll, wait, terminate, kill).
    `fork_ranks`: its ranks forked from its agent too (`forked_ranks`) — for CPU ranks only: a CUDA rank
    starts in a fresh interpreter, as CUDA asks of a process that uses it."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], log: str, fork_ranks: bool = False
    ) -> None:
        global _server
        if _server is None or not _server.alive():
            _server = _Server(env)
        if cmd[1:3] != ["-m", "torch.distributed.run"]:
            raise ValueError(f"not a torchrun command line: {cmd[:3]}")
        self.server, self.args = _server, cmd
        self.returncode: int | None = None
        argv = forked_ranks(cmd[3:]) if fork_ranks else cmd[3:]
        self.pid = _server.fork(argv, env, log)  # torchrun's own arguments

    def poll(self) -> int | None:
        if self.returncode is None:
            with self.server.changed:
                if self.pid in self.server.codes:
                    self.returncode = self.server.codes.pop(self.pid)
                elif not self.server.alive():  # its server died, and took torchrun with it
                    self.returncode = -15
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.server.changed:
            self.server.changed.wait_for(
                lambda: self.pid in self.server.codes or not self.server.alive(), timeout
            )
        code = self.poll()
        # None only after a timeout: without one, wait_for returns once torchrun has ended
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)


def _become_torchrun(request: dict[str, Any]) -> None:
    """In the forked child: the launch's environment, directory and log, then torchrun's main; never returns."""
    code = 1
    try:
        die_with_parent()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # lives as long as the process
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        sys.argv = ["torchrun", *request["argv"]]
        from torch.distributed.run import main

        main(request["argv"])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _send(msg: dict[str, Any]) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def serve() -> None:
    """The server: torchrun imported, then a fork per request until the launcher closes its stdin."""
    import torch.distributed.run  # noqa: F401 - the import every launch would otherwise pay

    import workbench.engine.train  # noqa: F401 - and what a rank forked from an agent imports next

    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05)
        if ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return  # the launcher is gone; the children's parent-death signal stops them
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _become_torchrun(request)
                _send({"id": request["id"], "pid": pid})
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send({"pid": pid, "rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    try:
        serve()
    except KeyboardInterrupt:  # a notebook's kernel interrupted or shut down: nothing to say
        pass
