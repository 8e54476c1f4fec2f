"""Where a local cluster's network namespaces live (launching/local_cluster.py), and how its commands reach
them. No torch here.

- **As root**: in the machine's own list (`ip netns add`, `ip netns list` shows them); every command runs
  as it is.
- **Without root, where the kernel lets anyone make a user namespace** (`unshare -rn` works): one *holder*
  process, `unshare --user --map-root-user --mount --net`, is root inside a user namespace of its own, with
  a private /run (a tmpfs) where `ip netns add` keeps the cluster's namespaces. Every command enters the
  holder's namespaces first (`nsenter -t HOLDER -U -m -n`): there it may make veths, bridges and tbf
  shaping, which the kernel allows an unprivileged user inside namespaces that user owns. Nothing is
  visible outside; when the holder and the processes inside end, everything it made is gone.
- **Neither**: `how_to_host()` refuses, naming what is missing.

`WORKBENCH_CLUSTER_HOST=userns` asks for a holder as root too: the cluster is then invisible to the machine's
`ip netns list` and ends with its holder (the test suite checks the unprivileged path this way).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from workbench.config import ConfigError

#: the holder: root in a user namespace of its own, with a /run of its own for `ip netns`; it waits for ever
#: (kept), or while its owner lives (a parent-death signal would not do: entering the user namespace clears it)
_HOLDER = [
    "unshare",
    "--user",
    "--map-root-user",
    "--mount",
    "--net",
    "--fork",
    "--kill-child",
    "sh",
    "-c",
]
_MOUNT = "mount -t tmpfs workbench-netns /run"


@dataclass(frozen=True, kw_only=True)
class NamespaceHost:
    """The machine's namespace list (holder_pid None: root), or an unprivileged holder's."""

    holder_pid: int | None = None
    #: the holder's start time (clock ticks since boot, /proc/PID/stat): a PID reused by another process is
    #: never taken for the holder
    holder_start: int | None = None

    @property
    def prefix(self) -> list[str]:
        """What a command is run behind to reach the cluster's namespaces."""
        if self.holder_pid is None:
            return []
        return ["nsenter", "-t", str(self.holder_pid), "-U", "-m", "-n", "--preserve-credentials"]

    def run(self, argv: list[str], *, check: bool = True) -> str:
        """`argv` where the namespaces are; its output (RuntimeError naming the command on failure)."""
        done = subprocess.run([*self.prefix, *argv], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def namespaces(self) -> list[str]:
        if shutil.which("ip") is None or not self.alive:
            return []
        out = self.run(["ip", "netns", "list"], check=False)
        return [line.split()[0] for line in out.splitlines() if line.strip()]

    def pids(self, ns: str) -> list[int]:
        return [int(p) for p in self.run(["ip", "netns", "pids", ns], check=False).split()]

    def stop_processes(self, namespaces: list[str], *, grace_s: float) -> None:
        """Every process in `namespaces` stopped: SIGTERM (a rank writes what it has), then SIGKILL to those
        left after `grace_s` — a process started meanwhile (a rank an agent was forking) is caught then."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in [p for ns in namespaces for p in self.pids(ns)]:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(self.pids(ns) for ns in namespaces):
                time.sleep(0.1)

    @property
    def alive(self) -> bool:
        if self.holder_pid is None:
            return True
        # a zombie (killed, not yet reaped) is not alive, nor another process under the same PID
        fields = _stat(self.holder_pid)
        return bool(fields) and fields[0] != "Z" and int(fields[19]) == self.holder_start

    def stop(self) -> None:
        """End the holder (and the `unshare` above it): what it held goes with it."""
        if self.holder_pid is None or not self.alive:
            return
        parent = int(_stat(self.holder_pid)[1])
        ours = [self.holder_pid] + (
            [parent] if _read(f"/proc/{parent}/comm").strip() == "unshare" else []
        )
        for pid in ours:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def how_to_host() -> str:
    """'root' or 'userns': how this process can make namespaces; a ConfigError naming what is missing."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(
            f"a local cluster needs {' and '.join(missing)} (iproute2: apt-get install iproute2)"
        )
    if os.geteuid() == 0 and os.environ.get("WORKBENCH_CLUSTER_HOST") != "userns":
        if _probe(["unshare", "--net", "true"]):
            return "root"
        if shutil.which("nsenter") and _probe(["unshare", "-rn", "true"]):
            return (
                "userns"  # root without the capabilities (a container's): a user namespace may do
            )
        raise ConfigError(
            "a local cluster makes network namespaces, and this process, root, may not (`unshare --net "
            "true` fails: a container without CAP_SYS_ADMIN and CAP_NET_ADMIN, nor user namespaces); "
            "start the container with --cap-add SYS_ADMIN --cap-add NET_ADMIN, or --privileged"
        )
    if shutil.which("unshare") and shutil.which("nsenter") and _userns_works():
        return "userns"
    raise ConfigError(
        "a local cluster makes network namespaces, veth links and a bridge, which needs root "
        f"(CAP_NET_ADMIN) or unprivileged user namespaces; this process runs as uid {os.geteuid()} "
        "and `unshare -rn true` fails here (the kernel or the container forbids user namespaces: "
        "see /proc/sys/user/max_user_namespaces, kernel.unprivileged_userns_clone, AppArmor's "
        "restrict_unprivileged_userns): run it with sudo, or in a container started with "
        "--cap-add NET_ADMIN"
    )


def start_holder(*, keep: bool) -> NamespaceHost:
    """An unprivileged holder, ready (its /run mounted). Unless `keep`, it ends when this process does,
    however it ends: a crashed notebook leaves nothing behind."""
    wait = (
        "exec sleep infinity" if keep else f"while [ -d /proc/{os.getpid()} ]; do sleep 0.2; done"
    )
    starter = subprocess.Popen(
        [*_HOLDER, f"{_MOUNT} && {wait}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        child = _child(starter.pid)
        if child is not None and "workbench-netns" in _read(f"/proc/{child}/mounts"):
            return NamespaceHost(holder_pid=child, holder_start=int(_stat(child)[19]))
        if starter.poll() is not None:
            err = starter.stderr.read().decode() if starter.stderr else ""
            raise ConfigError(f"the user namespace for a local cluster failed: {err.strip()}")
        time.sleep(0.02)
    starter.kill()
    raise ConfigError("the user namespace for a local cluster did not start within 10 s")


def _userns_works() -> bool:
    return _probe(["unshare", "-rn", "true"])


def _probe(argv: list[str]) -> bool:
    """Whether `argv` succeeds (a missing program: no)."""
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (state first, then the parent, ..., the start time
    at index 19); empty where the process is gone."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[1].split() if stat else []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
