"""A node lost mid-run on a local cluster (launching/lose_node.py): 2 nodes × 1 rank, elastic (nnodes 1:2), node 1
lost after its fifth step — every process SIGKILLed, or its link cut. The survivor's collective fails naming
nothing but an address (gloo's reset) or nothing at all (gloo's timeout); the run's record (analysis/recovery.py)
names the lost node and its ranks: the node of the failed group that the re-formed one lacks. The elastic agent
on node 0 re-forms the group alone from the newest checkpoint, and the run ends with the losses of the
uninterrupted run. Node 1, never node 0: node 0's agent hosts the c10d rendezvous store, as the first machine
of a real cluster does.

Tolerance 1e-5 relative, as tests/test_elastic.py: the same global batch each step, split over dp = 2 and then
dp = 1 (the checkpoint resharded), sums the same fp32 numbers in another order.

Timings are printed (the detection and the recovery, from the recorded moment of the loss) and asserted only
where the mechanism sets them, not the machine: a killed node's sockets answer with a reset, so the survivor
fails well inside the process-group timeout (measured: 0.03 s, 0.03–0.1 s over runs on the 2-core machine
with other work on it); a cut link answers nothing, so the survivor waits out the whole timeout (measured:
timeout + 0.02 s) — it cannot fail earlier.

Needs root (network namespaces): elsewhere every case skips, saying so."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.analysis.recovery import recoveries
from workbench.launching import local_cluster as lc
from workbench.launching.launcher import Nodes
from workbench.launching.lose_node import lose_node

ROOT = os.geteuid() == 0 and subprocess.run(["which", "ip"], capture_output=True).returncode == 0
needs_root = pytest.mark.skipif(
    not ROOT, reason="a local cluster needs root and iproute2 (network namespaces)"
)

STEPS = 12
#: the process-group timeout: a partition is detected after it
TIMEOUT_S = 8.0
#: rank 0 sleeps this long in every step (fault 'straggle'), so that node 1 is lost mid-run, not at its end
DELAY_S = 0.2
LOSE_AFTER = 5  # node 1 is lost once step 5 is in metrics.jsonl


def _rows(run_dir: str) -> list[dict]:
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []


def _run_and_lose(cluster: lc.LocalCluster, run_dir: str, how: str) -> wb.Run:
    """Launch the elastic run across `cluster` (in a thread: launch blocks), lose node 1 once step LOSE_AFTER is
    done, and return the run. Every wait is bounded."""
    config = RunConfig(
        dp=2,
        steps=STEPS,
        global_batch=8,
        checkpoint_every=2,
        max_restarts=2,
        timeout_s=TIMEOUT_S,
        fault="straggle",
        fault_delay_s=DELAY_S,
    )
    result: dict = {}

    def run() -> None:
        try:
            result["run"] = wb.launch(
                config, out=run_dir, cluster=cluster, nodes=Nodes(nnodes="1:2"), progress=False
            )
        except BaseException as e:  # handed to the test below
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 90
    while not any(r["step"] >= LOSE_AFTER for r in _rows(run_dir)):
        assert thread.is_alive(), f"the run ended before node 1 was lost: {result}"
        assert time.monotonic() < deadline, "no step 5 within 90 s"
        time.sleep(0.05)
    lose_node(cluster, 1, how=how, run_dir=run_dir)
    thread.join(timeout=150)
    assert not thread.is_alive(), "the run did not end within 150 s of the loss"
    if "error" in result:
        raise result["error"]
    return result["run"]


@needs_root
@pytest.mark.parametrize("how", ["kill", "partition"])
def test_a_lost_node_is_detected_and_the_run_recovers_on_the_nodes_left(tmp_path, launched, how):
    with lc.LocalCluster(name=f"c{how[:4]}", nodes=2, ranks_per_node=1, rate_mbit=1000) as c:
        run = _run_and_lose(c, str(tmp_path / how), how)
        lost, left = c.namespace(1), c.namespace(0)

    rows = _rows(run.path)
    assert [r["step"] for r in rows] == list(range(STEPS)), "every step once (redone ones replace)"
    worlds = [r["world_size"] for r in rows]
    assert worlds[0] == 2 and worlds[-1] == 1, f"two nodes, then the one left: {worlds}"

    [r] = recoveries(run.path)
    print(f"\n{how}: {r.describe()}")
    assert (r.nodes, r.ranks, r.how, r.nodes_after) == ([lost], [1], how, [left]), r
    assert r.detected_by.startswith(f"rank 0 ({left})"), r.detected_by
    assert r.lost_at < r.detected_at < r.regrouped_at < r.first_step_at, r
    # from the newest checkpoint (every 2 steps): at most the steps since it redone
    assert r.resumed_step % 2 == 0 and r.last_step - 1 <= r.resumed_step <= r.last_step + 1, r
    if how == "kill":  # the reset: at once, far inside the timeout
        assert r.detect_s < TIMEOUT_S / 2, r.describe()
    else:  # silence: the survivor waits out the process-group timeout
        assert r.detect_s >= TIMEOUT_S - 0.05, r.describe()

    whole = launched(dp=2, steps=STEPS, global_batch=8, timeout_s=TIMEOUT_S)
    for got, want in zip(run.metrics.loss, whole.metrics.loss, strict=True):
        assert abs(got - want) <= 1e-5 * abs(want), (got, want)


def test_node_0_is_not_lost():
    c = lc.LocalCluster(name="cnot", nodes=2, ranks_per_node=1)
    with pytest.raises(ConfigError, match="node 0 hosts the c10d rendezvous store"):
        lose_node(c, 0)
    with pytest.raises(ConfigError, match="'kill' or 'partition'"):
        lose_node(c, 1, how="unplug")
