"""A node lost mid-run on a local cluster (launching/lose_node.py): node 1 of 2 lost after its fifth step — every
process SIGKILLed, or its link cut — and the run recovers either way torchrun offers:

- elastic (nnodes 1:2): node 0's agent re-forms the group alone, from the newest checkpoint (dp halves);
- fixed membership (nnodes 2, max_restarts): node 0's agent waits in the rendezvous for the node to come back
  (its link up again), and the group re-forms whole, from the newest checkpoint.

The survivor's own error names an address at best (gloo's reset: "Read error [198.18.0.2]") or nothing (gloo's
timeout); the run's record (analysis/recovery.py) names the lost node and its ranks, from node_events.jsonl
or as the node of the failed group that the re-formed one lacks. Node 1, never node 0: node 0's agent hosts
the c10d rendezvous store, as the first machine of a real cluster does. Either way the run ends with the
losses of the uninterrupted run.

Tolerance 1e-5 relative, as tests/test_elastic.py: the same global batch each step, split over dp = 2 and then
dp = 1 (the checkpoint resharded), sums the same fp32 numbers in another order.

Timings are printed (the detection and the recovery, from the recorded moment of the loss) and asserted only
where the mechanism sets them, not the machine: a killed node's sockets answer with a reset, so the survivor
fails well inside the process-group timeout (measured: 0.01–0.2 s over runs on the 2-core machine with other
work on it); a cut link answers nothing, so the survivor waits out the whole timeout (measured: the timeout +
0.02 to 0.2 s) — it cannot fail earlier. A group that waits re-forms only after the node is back.

Needs root (network namespaces): elsewhere every case skips, saying so."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

import workbench as wb
from tests.cluster_skip import REPORTED, needs_cluster
from tests.distributed import metrics_rows
from workbench import ConfigError, RunConfig
from workbench.analysis.recovery import Recovery, recoveries
from workbench.launching import local_cluster as lc
from workbench.launching.launcher import Nodes
from workbench.launching.lose_node import lose_node, reconnect

STEPS = 12
#: the process-group timeout: a partition is detected after it
TIMEOUT_S = 8.0
#: rank 0 sleeps this long in every step (fault 'straggle'), so that node 1 is lost mid-run, not at its end
DELAY_S = 0.2
LOSE_AFTER = 5  # node 1 is lost once step 5 is in metrics.jsonl


def _run_and_lose(
    cluster: lc.LocalCluster,
    run_dir: str,
    *,
    how: str,
    nnodes: str | int,
    back_after_s: float | None = None,
) -> wb.Run:
    """Launch the run across `cluster` (in a thread: launch blocks), lose node 1 once step LOSE_AFTER is done
    (and, with `back_after_s`, reconnect it that long after), and return the run. Every wait is bounded."""
    config = RunConfig(
        dp=cluster.world_size,
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
                config, out=run_dir, cluster=cluster, nodes=Nodes(nnodes=nnodes), progress=False
            )
        except BaseException as e:  # handed to the test below
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 90
    while not any(r["step"] >= LOSE_AFTER for r in metrics_rows(run_dir)):
        assert thread.is_alive(), f"the run ended before node 1 was lost: {result}"
        assert time.monotonic() < deadline, f"no step {LOSE_AFTER} within 90 s"
        time.sleep(0.05)
    lose_node(cluster, 1, how=how, run_dir=run_dir)
    if back_after_s is not None:
        thread.join(timeout=back_after_s)
        reconnect(cluster, 1, run_dir=run_dir)
    thread.join(timeout=150)
    assert not thread.is_alive(), "the run did not end within 150 s of the loss"
    if "error" in result:
        raise result["error"]
    return result["run"]


def _check_recovered(
    run: wb.Run, whole: wb.Run, *, lost: str, ranks: list[int], how: str, after: list[str]
) -> Recovery:
    """Every step once, the loss recorded and measured in order, the losses the uninterrupted run's."""
    rows = metrics_rows(run.path)
    assert [r["step"] for r in rows] == list(range(STEPS)), "every step once (redone ones replace)"
    [r] = recoveries(run.path)
    print(f"\n{how}: {r.describe()}")
    REPORTED.append(f"{how}: {r.describe()}")  # printed at the suite's end (tests/conftest.py)
    assert (r.nodes, r.ranks, r.how, r.nodes_after) == ([lost], ranks, how, after), r
    # the first of the survivors to fail (with two ranks on node 0, either one)
    assert re.match(rf"rank \d+ \({after[0]}\)", r.detected_by), r.detected_by
    assert r.lost_at < r.detected_at < r.regrouped_at < r.first_step_at, r
    # from the newest checkpoint (every 2 steps): at most the steps since it redone
    assert r.resumed_step % 2 == 0 and r.last_step - 1 <= r.resumed_step <= r.last_step + 1, r
    if how == "kill":  # the reset: at once, far inside the timeout
        assert r.detect_s < TIMEOUT_S / 2, r.describe()
    else:  # silence: the survivor waits out the process-group timeout
        assert r.detect_s >= TIMEOUT_S - 0.05, r.describe()
    for got, want in zip(run.metrics.loss, whole.metrics.loss, strict=True):
        assert abs(got - want) <= 1e-5 * abs(want), (got, want)
    return r


@needs_cluster
def test_a_killed_node_is_detected_at_once_and_the_run_goes_on_without_it(tmp_path, launched):
    """Elastic, 2 nodes × 1 rank: node 1's processes SIGKILLed; node 0 goes on alone."""
    with lc.LocalCluster(name="ckill", nodes=2, ranks_per_node=1, rate_mbit=1000) as c:
        run = _run_and_lose(c, str(tmp_path / "kill"), how="kill", nnodes="1:2")
        lost, left = c.namespace(1), c.namespace(0)
    whole = launched(dp=2, steps=STEPS, global_batch=8, timeout_s=TIMEOUT_S)
    _check_recovered(run, whole, lost=lost, ranks=[1], how="kill", after=[left])
    worlds = [r["world_size"] for r in metrics_rows(run.path)]
    assert worlds[0] == 2 and worlds[-1] == 1, f"two nodes, then the one left: {worlds}"


@needs_cluster
def test_a_partitioned_node_is_waited_for_and_the_group_re_forms_whole(tmp_path, launched):
    """Fixed membership, 2 nodes × 1 rank: node 1's link cut, and up again 2 s after the survivor's timeout. The
    group waits in the rendezvous (node 1's agent, blocked on the store across the cut, goes on once the link
    is back) and re-forms with both nodes."""
    with lc.LocalCluster(name="cwait", nodes=2, ranks_per_node=1, rate_mbit=1000) as c:
        run = _run_and_lose(
            c, str(tmp_path / "wait"), how="partition", nnodes=2, back_after_s=TIMEOUT_S + 2
        )
        both = [c.namespace(0), c.namespace(1)]
    whole = launched(dp=2, steps=STEPS, global_batch=8, timeout_s=TIMEOUT_S)
    r = _check_recovered(run, whole, lost=both[1], ranks=[1], how="partition", after=both)
    assert r.detected_at < r.back_at < r.regrouped_at, "it waited for the node"
    assert {row["world_size"] for row in metrics_rows(run.path)} == {2}


@pytest.mark.slow  # ~35 s: the two cases above cover kill and partition in make test
@needs_cluster
def test_a_partitioned_node_is_left_behind_by_an_elastic_run(tmp_path, launched):
    """Elastic, 2 nodes × 2 ranks: node 1's link cut for good; node 0 goes on alone after the timeout (dp 4 → 2),
    and node 1's agent — blocked on the rendezvous store it cannot reach — is stopped when the run is done."""
    with lc.LocalCluster(name="cpart", nodes=2, ranks_per_node=2, rate_mbit=1000) as c:
        run = _run_and_lose(c, str(tmp_path / "part"), how="partition", nnodes="1:2")
        lost, left = c.namespace(1), c.namespace(0)
    whole = launched(dp=4, steps=STEPS, global_batch=8, timeout_s=TIMEOUT_S)
    _check_recovered(run, whole, lost=lost, ranks=[2, 3], how="partition", after=[left])
    worlds = [r["world_size"] for r in metrics_rows(run.path)]
    assert worlds[0] == 4 and worlds[-1] == 2, f"two nodes, then the one left: {worlds}"


def test_node_0_is_not_lost():
    c = lc.LocalCluster(name="cnot", nodes=2, ranks_per_node=1)
    with pytest.raises(ConfigError, match="node 0 hosts the c10d rendezvous store"):
        lose_node(c, 0)
    with pytest.raises(ConfigError, match="'kill' or 'partition'"):
        lose_node(c, 1, how="unplug")


def _trace(path, *, rank: int, node: str, epoch_s: float, steps: dict[int, float]) -> None:
    """A rank's trace as the recorder writes its header and step spans (each step 0.1 s, ending at `steps[k]`
    seconds after the epoch)."""
    events = [
        {"ph": "X", "name": f"ProfilerStep#{k}", "ts": (end - 0.1) * 1e6, "dur": 0.1e6}
        for k, end in steps.items()
    ]
    header = {"node": node, "epoch_unix_us": epoch_s * 1e6}
    path.mkdir(parents=True, exist_ok=True)
    (path / f"trace_rank{rank}.json").write_text(
        json.dumps({"distributedInfo": {"rank": rank}, "workbench": header, "traceEvents": events})
    )


def test_a_loss_nobody_recorded_is_timed_from_the_lost_nodes_last_step(tmp_path):
    """No node_events.jsonl (a machine that died on its own): the node missing from the re-formed group is the
    lost one, its last finished step stands in for the moment of the loss, and a restart on the same nodes with
    nothing recorded (a rank's own failure) is no node loss."""
    run = tmp_path / "run"
    first, second = run / "attempts" / "restart-0", run / "attempts" / "restart-1"
    _trace(first, rank=0, node="n0", epoch_s=1000, steps={0: 1, 1: 2, 2: 3})
    _trace(first, rank=1, node="n1", epoch_s=1000, steps={0: 1, 1: 2})
    (first / "error_rank0.json").write_text(
        json.dumps({"rank": 0, "time": 1012.5, "type": "RuntimeError", "message": "timed out"})
    )
    _trace(second, rank=0, node="n0", epoch_s=1020, steps={2: 1.5, 3: 2})
    (second / "error_rank0.json").write_text(
        json.dumps({"rank": 0, "time": 1023, "type": "RuntimeError", "message": "own fault"})
    )
    _trace(run, rank=0, node="n0", epoch_s=1030, steps={3: 1, 4: 2})

    [r] = recoveries(str(run))
    assert (r.attempt, r.nodes, r.ranks, r.how, r.nodes_after) == (0, ["n1"], [1], None, ["n0"])
    assert r.lost_at == 1002 and r.last_step == 1, "rank 1's last finished step: step 1, at +2 s"
    assert (r.detect_s, r.regroup_s, r.recover_s) == (10.5, 18, 19.5)
    assert r.resumed_step == 2 and "not recorded" in r.describe()
    assert r.detected_by == "rank 0 (n0): RuntimeError: timed out"
