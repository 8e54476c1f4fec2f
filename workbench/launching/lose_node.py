"""A node of a local cluster lost mid-run (launching/local_cluster.py), the two ways a machine goes:

    kill       every process in the node's namespace SIGKILLed (`ip netns pids`): a machine that loses
               power. Its sockets go with it, so the kernel answers the survivors' next packets with a
               reset: their collective fails at once ("Read error [198.18.0.2]:…: Connection reset by peer").
    partition  the node's port on the switch taken down (`ip link set nK down` in the switch's namespace):
               a pulled cable, a dead switch port. The node's processes live on; nothing crosses in either
               direction and nothing says so, so each side's collective waits out the process-group
               timeout (RunConfig.timeout_s: gloo's "Timed out waiting …ms for send operation to complete"),
               the lost node's ranks too. `reconnect` puts the port back up.

Each event is appended to the run directory's `node_events.jsonl` (the node, what happened, the wall-clock
time), so that analysis/recovery.py measures detection and recovery from the moment of the loss.

Node 0 is never lost here: its torchrun agent hosts the c10d rendezvous store, as the first machine of a
real cluster does, and torchrun's c10d rendezvous has no fail-over — without that store no group re-forms,
and the run ends (a real deployment puts the rendezvous on a machine outside the job, e.g. etcd, to survive
that). No torch here.
"""

from __future__ import annotations

import json
import os
import signal
import time

from workbench.analysis.recovery import EVENTS
from workbench.config import ConfigError
from workbench.launching.local_cluster import LocalCluster

HOW = ("kill", "partition")


def lose_node(
    cluster: LocalCluster, node: int, *, how: str = "kill", run_dir: str | None = None
) -> float:
    """Lose node `node` of `cluster` now (`how`: 'kill' or 'partition'), record it in `run_dir`'s
    node_events.jsonl, and return the wall-clock time it was lost (time.time())."""
    if how not in HOW:
        raise ConfigError(f"how={how!r}: a node is lost by 'kill' or 'partition'")
    if not 1 <= node < cluster.nodes:
        raise ConfigError(
            f"node {node} of cluster {cluster.name!r} ({cluster.nodes} nodes): lose one of nodes "
            f"1..{cluster.nodes - 1} — node 0 hosts the c10d rendezvous store (as the first machine of "
            f"a real cluster does), and without it no group can re-form"
        )
    at = time.time()
    if how == "kill":
        _kill_all(cluster, node)
    else:
        _switch_port(cluster, node, "down")
    if run_dir is not None:
        record(run_dir, node=cluster.namespace(node), event=how, at=at)
    return at


def reconnect(cluster: LocalCluster, node: int, *, run_dir: str | None = None) -> float:
    """Put a partitioned node's switch port back up; record it; return the wall-clock time."""
    at = time.time()
    _switch_port(cluster, node, "up")
    if run_dir is not None:
        record(run_dir, node=cluster.namespace(node), event="reconnect", at=at)
    return at


def record(run_dir: str, *, node: str, event: str, at: float) -> None:
    """One line of node_events.jsonl: {"node", "event", "time"}."""
    with open(os.path.join(run_dir, EVENTS), "a") as f:
        f.write(json.dumps({"node": node, "event": event, "time": at}) + "\n")


def _kill_all(cluster: LocalCluster, node: int) -> None:
    """SIGKILL every process of the node's namespace, then again for any it had started meanwhile (a rank
    that a torchrun agent was forking as the first signal went out)."""
    host = cluster.host  # the machine's namespaces, or an unprivileged holder's
    for _ in range(3):
        pids = host.pids(cluster.namespace(node))
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _switch_port(cluster: LocalCluster, node: int, state: str) -> None:
    cluster.host.run(
        ["ip", "netns", "exec", cluster.switch, "ip", "link", "set", f"n{node}", state]
    )
