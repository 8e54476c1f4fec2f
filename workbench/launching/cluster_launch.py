"""A run across a local cluster's nodes (launching/local_cluster.py): one torchrun agent per node, each
started inside its node's namespace with the command several real machines would run —

    ip netns exec wb-NAME-nK  python -m torch.distributed.run --nnodes N --node-rank K \\
        --rdzv-backend c10d --rdzv-endpoint 198.18.0.1:29400 --rdzv-conf is_host=(K == 0) \\
        --local-addr 198.18.0.(K+1) ...

— the c10d rendezvous hosted by node 0's agent across the shaped links, gloo binding each node's `eth0`.
Inside a namespace every node has the machine's host name, so torchrun cannot tell by name which agent
hosts the rendezvous: `is_host` says it, and `--local-addr` gives each agent's address (published to the
ranks as MASTER_ADDR), as on machines whose names do not resolve. Each agent's
output goes to the run's launcher.log (appended, line by line). No torch here.
"""

from __future__ import annotations

import subprocess
import time

from workbench.config import ConfigError, ValidConfig
from workbench.launching.lifetime import die_with_parent
from workbench.launching.local_cluster import LocalCluster
from workbench.launching.torchrun_command import Nodes, torchrun_command

#: after one node's agent fails in a run of fixed membership, the others get this long to end on their
#: own (their rendezvous closes, their collectives time out) before they are stopped
_GRACE_S = 30.0
#: after one node's agent of an elastic run ended well (the run is done), the others get this long: the
#: agents of its last group end with it within a second or two, and a node cut off from the rendezvous
#: (a partition: launching/lose_node.py) would wait for it until torchrun's join timeout, 600 s
_DONE_GRACE_S = 5.0


def cluster_nodes(config: ValidConfig, cluster: LocalCluster, nodes: Nodes) -> Nodes:
    """torchrun's multi-machine settings for `cluster`: all its nodes (or MIN:MAX of them, elastic), the
    rendezvous on node 0. A ConfigError, before any process starts, where the run does not fit it."""
    low, high = nodes.range
    if high != 1 and high != cluster.nodes:
        raise ConfigError(
            f"nnodes={nodes.nnodes} on cluster {cluster.name!r} of {cluster.nodes} nodes: leave nnodes "
            f"out (all of them), or give MIN:{cluster.nodes} for elastic membership"
        )
    if nodes.rdzv_endpoint is not None or nodes.node_rank:
        raise ConfigError(
            "a cluster run places its agents itself: leave node_rank and rdzv_endpoint out"
        )
    if config.world_size != cluster.world_size:
        raise ConfigError(
            f"the run has {config.world_size} ranks (dp×tp×pp×cp) and cluster {cluster.name!r} "
            f"{cluster.nodes} nodes × {cluster.ranks_per_node} ranks = {cluster.world_size}: bring up "
            f"a cluster of its shape (workbench cluster up --nodes N --ranks-per-node R) or change dp"
        )
    if config.ranks_per_node not in (0, cluster.ranks_per_node):
        raise ConfigError(
            f"ranks_per_node={config.ranks_per_node} on cluster {cluster.name!r}, whose nodes have "
            f"{cluster.ranks_per_node} ranks each: leave ranks_per_node at 0 (the node's own)"
        )
    nnodes: int | str = nodes.nnodes if high != 1 else cluster.nodes
    return Nodes(nnodes=nnodes, rdzv_endpoint=cluster.rdzv_endpoint, rdzv_id=nodes.rdzv_id)


class NodeAgents:
    """One torchrun agent per node, followed as one (launching/lifetime.Torchrun). Fixed membership: done
    when every agent is, its code the first failure's; an agent that failed gives the others `_GRACE_S`
    to end before they are stopped. Elastic (MIN:MAX): the run succeeded if one of them ended well — a
    node lost on the way is what elasticity is for —, and it is done when the agents still alive are, or
    `_DONE_GRACE_S` after the first ended well (a lost node's agent, still waiting for a rendezvous it
    cannot reach, is stopped then)."""

    def __init__(self, procs: list[subprocess.Popen], *, elastic: bool) -> None:
        self.procs, self.elastic = procs, elastic
        self._failed_at: float | None = None
        self._done_at: float | None = None

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and not self.elastic:
            self._failed_at = self._failed_at or time.monotonic()
            self._end_the_rest(since=self._failed_at, grace_s=_GRACE_S)
        if self.elastic and 0 in codes:
            self._done_at = self._done_at or time.monotonic()
            self._end_the_rest(since=self._done_at, grace_s=_DONE_GRACE_S)
        if any(c is None for c in codes):
            return None
        if self.elastic and 0 in codes:
            return 0
        return failed[0] if failed else 0

    def _end_the_rest(self, *, since: float, grace_s: float) -> None:
        """SIGTERM to the agents still running `grace_s` after `since`, SIGKILL `grace_s` later (an agent
        blocked in a store call may not act on SIGTERM)."""
        waited = time.monotonic() - since
        if waited > 2 * grace_s:
            self.kill()
        elif waited > grace_s:
            self.terminate()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("torchrun agents", timeout or 0)
            time.sleep(0.1)
        return rc

    def terminate(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def start_agents(
    config: ValidConfig,
    run_dir: str,
    *,
    cluster: LocalCluster,
    nodes: Nodes,
    env: dict[str, str],
    log,
) -> NodeAgents:
    """Start every node's torchrun agent in its namespace (`nodes` from cluster_nodes), writing into `log`."""
    procs: list[subprocess.Popen] = []
    try:
        for k in range(cluster.nodes):
            procs.append(
                _start_agent(
                    config, run_dir, cluster=cluster, nodes=nodes, node=k, env=env, log=log
                )
            )
    except BaseException:  # the agents already started do not wait for ever for the others
        NodeAgents(procs, elastic=False).kill()
        raise
    return NodeAgents(procs, elastic=nodes.elastic)


def _start_agent(
    config: ValidConfig,
    run_dir: str,
    *,
    cluster: LocalCluster,
    nodes: Nodes,
    node: int,
    env: dict[str, str],
    log,
) -> subprocess.Popen:
    """Node `node`'s torchrun agent, started in its namespace."""
    this = Nodes(
        nnodes=nodes.nnodes,
        node_rank=node,
        rdzv_endpoint=nodes.rdzv_endpoint,
        rdzv_id=nodes.rdzv_id,
        hosts_rendezvous=node == 0,
        local_addr=cluster.address(node),
    )
    cmd = cluster.exec_argv(node, torchrun_command(config, run_dir, this))
    log.write(" ".join(cmd) + "\n")
    log.flush()
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**env, **cluster.env(node)},
        preexec_fn=die_with_parent,
    )
