"""A cluster on one machine: each node a Linux network namespace with its own address, every node's link
to a shared bridge shaped by the kernel's token-bucket filter (`tc qdisc tbf`) at the inter-node rate.

    wb-NAME-sw    the switch: a namespace holding the bridge `br0` and one port per node (`n0`, `n1`, ...)
    wb-NAME-n0    node 0: `lo` and `eth0` = 198.18.0.1/24, its veth peer being `n0` on the bridge
    wb-NAME-n1    node 1: `eth0` = 198.18.0.2/24, ...

Messages between two nodes cross two shaped links (the sender's `eth0` out, the bridge's port to the
receiver out), each at `rate_mbit`: real bytes on a real (virtual) wire, timed by the clock. Ranks inside
one node reach each other through the node's own address, which the kernel routes over the node's
loopback: fast, as NVLink is beside InfiniBand. `netem` is not available on this kind of machine, so no
delay is added: a link's latency is the kernel's, a few tens of microseconds (where a lesson needs more, it
stays emulated and says so).

Nothing is created in the machine's own namespace: every interface lives in the cluster's namespaces,
and deleting them (`down`) deletes the links and the bridge with them. Addresses are in 198.18.0.0/15, the
range set aside for benchmarking (RFC 2544); traffic never leaves the namespaces made here.

Needs root, or unprivileged user namespaces where the kernel allows them: then the namespaces live inside
one holder process's user namespace (launching/namespace_host.py). Elsewhere `up` refuses, naming what is
missing. The cluster's shape (and its holder) is kept in /run/workbench/clusters/NAME.json as root (a tmpfs:
gone at reboot, as the namespaces are), else in $XDG_RUNTIME_DIR (or the temporary directory); what runs
on a cluster keeps its files in NAME.d/ beside it (`scratch_dir`). No torch here.
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field

from workbench.config import ConfigError
from workbench.launching.namespace_host import NamespaceHost, how_to_host, start_holder

#: where each cluster's shape is kept while it is up: /run as root, else the user's runtime directory
STATE_DIR = (
    "/run/workbench/clusters"
    if os.geteuid() == 0
    else os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir(),
        f"workbench-{os.geteuid()}",
        "clusters",
    )
)
#: node k's address is SUBNET.(k+1)/24: in the benchmarking range 198.18.0.0/15 (RFC 2544)
SUBNET = "198.18.0"
#: the rendezvous port on node 0 (each cluster's namespaces have ports of their own)
RDZV_PORT = 29400
#: every namespace a cluster makes is named wb-NAME-…; NAME is short, so that interface names stay legal
_NAME = re.compile(r"^[a-z0-9]{1,10}$")
_PREFIX = "wb-"


@dataclass(kw_only=True)
class LocalCluster:
    """N nodes of R ranks each, as network namespaces joined by a bridge; every node's link shaped at
    `rate_mbit` Mbit/s each way (None: unshaped, as fast as the kernel copies)."""

    name: str = "wb"
    nodes: int = 2
    ranks_per_node: int = 2
    rate_mbit: float | None = 1000.0
    #: this object brought it up (a `with` block then removes it at its end)
    _made: bool = field(default=False, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(
                f"cluster name {self.name!r}: 1–10 lowercase letters or digits (it names the "
                f"namespaces wb-NAME-n0, ... and must fit Linux's 15-character interface names)"
            )
        if not 1 <= self.nodes <= 250:
            raise ConfigError(f"cluster nodes={self.nodes}: 1 to 250 nodes (one /24 of addresses)")
        if self.ranks_per_node < 1:
            raise ConfigError(f"cluster ranks_per_node={self.ranks_per_node}: at least 1")
        if self.rate_mbit is not None and not 0 < self.rate_mbit <= 100_000:
            raise ConfigError(
                f"cluster rate_mbit={self.rate_mbit}: a link rate in Mbit/s, 0 < rate ≤ 100000, "
                f"or None for an unshaped link"
            )

    # names and addresses
    @property
    def switch(self) -> str:
        return f"{_PREFIX}{self.name}-sw"

    def namespace(self, node: int) -> str:
        return f"{_PREFIX}{self.name}-n{node}"

    def address(self, node: int) -> str:
        return f"{SUBNET}.{node + 1}"

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.address(0)}:{RDZV_PORT}"

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        """The node of a global rank: torchrun numbers each node's ranks consecutively."""
        return rank // self.ranks_per_node

    @property
    def host(self) -> NamespaceHost:
        """Where this cluster's namespaces are: the machine's (root), or its unprivileged holder's."""
        return _host(self.name)

    def exec_argv(self, node: int, argv: list[str]) -> list[str]:
        """`argv` run inside node `node`'s namespace."""
        return [*self.host.prefix, "ip", "netns", "exec", self.namespace(node), *argv]

    def env(self, node: int) -> dict[str, str]:
        """What a process in node `node` needs: gloo and NCCL bind its `eth0` (the default, the machine's
        hostname, resolves to an address that does not exist inside the namespace), and its name."""
        return {
            "GLOO_SOCKET_IFNAME": "eth0",
            "NCCL_SOCKET_IFNAME": "eth0",
            "WORKBENCH_NODE": self.namespace(node),
        }

    # bringing it up and down
    def up(self, *, keep: bool = False) -> LocalCluster:
        """Create the namespaces, the bridge and the shaped links (an earlier cluster of this name is
        removed first). On any failure, whatever was made is removed before the error is raised; and
        unless `keep` (the CLI's `cluster up`, which ends at once), when this process exits."""
        how = how_to_host()
        owner = _live_owner(self.name)
        if owner is not None and owner != os.getpid():
            raise ConfigError(
                f"cluster {self.name!r} is up, brought up by process {owner}, which still runs: "
                f"choose another name, or remove it (workbench cluster down --name {self.name})"
            )
        down(self.name)
        host = start_holder(keep=keep) if how == "userns" else NamespaceHost()
        self._save(owner=os.getpid(), host=host)
        try:
            host.run(["ip", "netns", "add", self.switch])
            self._in(self.switch, "ip link set lo up")
            self._in(self.switch, "ip link add br0 type bridge")
            self._in(self.switch, "ip link set br0 up")
            for k in range(self.nodes):
                self._add_node(k)
            self.set_rate(self.rate_mbit)
        except BaseException:
            down(self.name)
            raise
        if not keep:
            atexit.register(_down_if_owned, self.name, os.getpid())
        self._made = True
        return self

    @property
    def is_up(self) -> bool:
        """Up, in this shape."""
        try:
            return attach(self.name) == self
        except ConfigError:
            return False

    def _add_node(self, k: int) -> None:
        ns = self.namespace(k)
        self.host.run(["ip", "netns", "add", ns])
        # both ends made inside their namespaces: no interface ever appears in the machine's own
        link = f"ip link add n{k} netns {self.switch} type veth peer name eth0 netns {ns}"
        self.host.run(link.split())
        self._in(self.switch, f"ip link set n{k} master br0 up")
        self._in(ns, f"ip addr add {self.address(k)}/24 dev eth0")
        self._in(ns, "ip link set eth0 up")
        self._in(ns, "ip link set lo up")

    def set_rate(self, rate_mbit: float | None) -> None:
        """Shape every node's link, both ways, at `rate_mbit` (None: remove the shaping). tbf's bucket
        holds 1 ms of traffic (at least 32 KiB): a message longer than that flows at the rate."""
        for k in range(self.nodes):
            for ns, dev in ((self.namespace(k), "eth0"), (self.switch, f"n{k}")):
                if rate_mbit is None:
                    self.host.run(
                        ["ip", "netns", "exec", ns, *f"tc qdisc del dev {dev} root".split()],
                        check=False,
                    )
                    continue
                burst = max(int(rate_mbit * 1e6 / 8 / 1000), 32 * 1024)
                tbf = f"tc qdisc replace dev {dev} root tbf rate {rate_mbit}mbit burst {burst} latency 200ms"
                self._in(ns, tbf)
        self.rate_mbit = rate_mbit
        if os.path.exists(_state_path(self.name)):
            state = _read_state(self.name)
            self._save(owner=state["owner_pid"], host=self.host)

    def _save(self, *, owner: int, host: NamespaceHost) -> None:
        """The shape, the process that brought the cluster up (its owner), and where its namespaces are."""
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(_state_path(self.name), "w") as f:
            shape = {k: v for k, v in asdict(self).items() if not k.startswith("_")}
            holder = {"holder_pid": host.holder_pid, "holder_start": host.holder_start}
            json.dump({**shape, "owner_pid": owner, **holder}, f)

    def down(self) -> None:
        down(self.name)
        self._made = False

    def __enter__(self) -> LocalCluster:
        """Up: this one (removed at the block's end), or the same shape already up (left as it was)."""
        return self if self.is_up and not self._made else self.up()

    def __exit__(self, *exc: object) -> None:
        if self._made:
            self.down()

    def _in(self, ns: str, command: str) -> None:
        self.host.run(["ip", "netns", "exec", ns, *command.split()])


def cluster(
    name: str = "wb", *, nodes: int = 2, ranks_per_node: int = 2, rate_mbit: float | None = 1000.0
) -> LocalCluster:
    """A cluster of `nodes` × `ranks_per_node` on this machine, brought up (removed when this process
    exits, or at the end of a `with` block): `wb.launch(config, cluster=c)` runs across it."""
    return LocalCluster(
        name=name, nodes=nodes, ranks_per_node=ranks_per_node, rate_mbit=rate_mbit
    ).up()


def clusters() -> list[str]:
    """The names of every cluster up on this machine that this user can see: as root, every one whose
    namespaces exist (a killed run's too); and every one whose holder lives."""
    names = set()
    for ns in NamespaceHost().namespaces() if os.geteuid() == 0 else []:
        m = re.match(rf"^{_PREFIX}([a-z0-9]+)-(sw|n\d+)$", ns)
        if m:
            names.add(m.group(1))
    if os.path.isdir(STATE_DIR):
        for file in os.listdir(STATE_DIR):
            name = file.removesuffix(".json")
            if file.endswith(".json") and _host(name).alive and _namespaces(name):
                names.add(name)
    return sorted(names)


def status(name: str) -> dict:
    """A cluster's shape (as it was brought up), its namespaces and each node's processes."""
    ours = _namespaces(name)
    shape = _read_state(name) if os.path.exists(_state_path(name)) else {}
    return {
        "name": name,
        "up": bool(ours),
        **shape,
        "namespaces": {ns: len(_host(name).pids(ns)) for ns in ours},
    }


def attach(name: str) -> LocalCluster:
    """The cluster `name` that is up (ConfigError naming the ones that are, if it is not)."""
    path = _state_path(name)
    if not os.path.exists(path) or name not in clusters():
        up = clusters()
        raise ConfigError(
            f"cluster {name!r} is not up; "
            + (f"the clusters up are {up}" if up else "no cluster is up")
            + f" (start one: workbench cluster up --name {name})"
        )
    shape = _read_state(name)
    for key in ("owner_pid", "holder_pid", "holder_start"):
        shape.pop(key, None)
    return LocalCluster(**shape)


def owned_by(pid: int) -> list[str]:
    """The clusters up that process `pid` brought up."""
    return [
        n
        for n in clusters()
        if os.path.exists(_state_path(n)) and _read_state(n)["owner_pid"] == pid
    ]


def scratch_dir(name: str) -> str:
    """A folder for what runs on cluster `name` keeps (a local Slurm's configuration, key, state and logs:
    launching/local_slurm.py); `down` removes it with the cluster."""
    return os.path.join(STATE_DIR, f"{name}.d")


def down(name: str, grace_s: float = 5.0) -> None:
    """Remove cluster `name`: its processes (SIGTERM, then SIGKILL after `grace_s`), its namespaces
    (the links and the bridge go with them), its holder if it has one, its state and its scratch folder.
    Safe to call on a cluster half made, or one whose run was killed."""
    host, ours = _host(name), _namespaces(name)
    host.stop_processes(ours, grace_s=grace_s)
    for ns in ours:
        host.run(["ip", "netns", "del", ns], check=False)
    host.stop()
    if os.path.exists(_state_path(name)):
        os.remove(_state_path(name))
    # and what a runner keeps outside the scratch folder, named in a remove-also.* file there (Ray's)
    scratch = scratch_dir(name)
    for named in glob.glob(os.path.join(scratch, "remove-also.*")):
        with open(named) as f:
            shutil.rmtree(f.read().strip(), ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)


def _host(name: str) -> NamespaceHost:
    """Where cluster `name`'s namespaces are: its holder's, as its state says, else the machine's."""
    if not os.path.exists(_state_path(name)):
        return NamespaceHost()
    state = _read_state(name)
    return NamespaceHost(holder_pid=state.get("holder_pid"), holder_start=state.get("holder_start"))


def _namespaces(name: str) -> list[str]:
    """Cluster `name`'s namespaces, sorted."""
    return sorted(ns for ns in _host(name).namespaces() if ns.startswith(f"{_PREFIX}{name}-"))


def available() -> str | None:
    """None where a local cluster can be made here, else why not (what a test's skip or a notebook says)."""
    try:
        how_to_host()
    except ConfigError as e:
        return str(e)
    return None


def _live_owner(name: str) -> int | None:
    """The process that brought cluster `name` up, where that process still runs."""
    if not os.path.exists(_state_path(name)):
        return None
    owner = _read_state(name).get("owner_pid")
    return owner if owner is not None and os.path.exists(f"/proc/{owner}") else None


def _down_if_owned(name: str, pid: int) -> None:
    """At this process's exit: remove cluster `name` if it is still the one this process brought up."""
    if os.path.exists(_state_path(name)) and _read_state(name).get("owner_pid") == pid:
        down(name)


def _read_state(name: str) -> dict:
    with open(_state_path(name)) as f:
        return json.load(f)


def _state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")
