"""Fault tolerance: a SIGKILLed rank makes torchrun restart the group, which resumes from the newest
checkpoint and finishes with the uninterrupted run's losses, keeping both attempts' traces; a NaN
gradient on one rank is detected on every rank at the same step, which all skip."""

import json
import math
import os

import pytest

from workbench.trace.validate import validate_run


@pytest.mark.slow  # notebook 08 holds a SIGKILLed rank's restart to the uninterrupted losses in make test
def test_a_killed_rank_is_restarted_from_the_last_checkpoint(launched):
    """Rank 1 is SIGKILLed in step 3 (no handler runs); the checkpoint before step 2 is the newest, so
    the restarted group redoes steps 2–5. fp32 on gloo: the losses equal the uninterrupted run's exactly."""
    run = launched(
        dp=2, steps=6, checkpoint_every=2, max_restarts=1, fault="kill", fault_rank=1, fault_step=3
    )
    whole = launched(dp=2, steps=6)
    assert list(run.metrics.step) == list(range(6))
    assert list(run.metrics.loss) == list(whole.metrics.loss)
    assert list(run.metrics.attempt) == [0, 0, 1, 1, 1, 1], "the restart shows in metrics.jsonl"
    assert validate_run(run.path) == []
    failed = os.path.join(run.path, "attempts", "restart-0")
    assert {"trace_rank0.json", "trace_rank1.json", "error_rank0.json", "metrics.jsonl"} <= set(
        os.listdir(failed)
    )
    assert json.load(open(os.path.join(failed, "trace_rank1.json")))["workbench"]["recovered"], (
        "the killed rank's streamed events are kept"
    )
    both = json.load(open(os.path.join(run.path, "trace_all_attempts.json")))["traceEvents"]
    marker = [e for e in both if e["name"] == "restart 1"]
    steps = [
        (e["ts"], e["args"]["step"])
        for e in both
        if e["name"].startswith("ProfilerStep") and e["pid"] == 1
    ]
    first = [ts for ts, s in steps if ts < marker[0]["ts"]]
    assert len(marker) == 1 and len(first) >= 3, (
        "attempt 0's steps, then the restart, on one timeline"
    )
    assert sorted(s for ts, s in steps if ts > marker[0]["ts"]) == [2, 3, 4, 5]


@pytest.mark.parametrize(
    "config",
    [
        {"dp": 2},
        {"dp": 2, "zero": 3},
        pytest.param({"tp": 2}, marks=pytest.mark.slow),
        pytest.param({"dp": 2, "precision": "bf16"}, marks=pytest.mark.slow),
    ],
    ids=["dp", "zero3", "tp", "bf16"],
)
def test_a_nan_gradient_skips_the_step_on_every_rank(launched, config):
    """A NaN injected into rank 1's gradients at step 2: the global gradient norm (summed over every
    rank's share) is NaN on every rank, so all skip that update together; training goes on."""
    run = launched(steps=5, fault="nan-grad", fault_rank=1, fault_step=2, **config)
    m = run.metrics
    assert list(m.skipped) == [False, False, True, False, False]
    assert math.isnan(m.grad_norm[2]) and not m.grad_norm.drop(2).isna().any()
    assert m.loss.drop(2).map(math.isfinite).all()
    for t in run.traces:
        opt = [e["args"]["skipped"] for e in t["traceEvents"] if e.get("name") == "optimizer"]
        assert opt == [False, False, True, False, False], t["workbench"]["rank"]


@pytest.mark.slow  # notebook 08 checks the skip in make test
def test_a_loss_spike_is_skipped_like_a_nan_gradient(launched):
    """Rank 1's loss (and gradients) ×10 at step 4: the global loss jumps ~5.5× above the median of the
    steps before, every rank sees it (the loss is all-reduced before the update), all skip. The run then
    goes on exactly as one whose step 4 was skipped for a NaN gradient — the weights and Adam's state are
    untouched either way."""
    spike = launched(
        dp=2, steps=6, loss_spike_factor=2.0, fault="loss-spike", fault_rank=1, fault_step=4
    )
    nan = launched(dp=2, steps=6, fault="nan-grad", fault_rank=1, fault_step=4)
    m = spike.metrics
    assert list(m.skipped) == [False] * 4 + [True, False]
    assert m.anomaly[4] == "loss spike" and nan.metrics.anomaly[4] == "non-finite gradient norm"
    assert m.loss[4] > 2 * m.loss[:4].median()
    assert m.loss[5] == nan.metrics.loss[5]
    for t in spike.traces:
        opt = [e["args"] for e in t["traceEvents"] if e.get("name") == "optimizer"]
        assert opt[4]["anomaly"] == "loss spike" and opt[4]["skipped"]


def test_doctor_names_a_straggler(launched):
    """Rank 1 sleeps 40 ms in every step from step 1 ("straggle"): the other rank waits for it in the
    gradient all-reduce, and `workbench doctor` on the finished run names rank 1 by that imbalance (40 ms
    is several times this machine's step: no noise makes rank 0 the slow one). A balanced run is not
    asserted to show no straggler: one 100 ms hiccup of the shared machine can put one rank 10 % of a
    step behind on average, and the read-out would say so, rightly."""
    from workbench.analysis.doctor import diagnose

    slow = launched(dp=2, steps=5, fault="straggle", fault_rank=1, fault_step=1, fault_delay_s=0.04)
    report = diagnose(slow.path)
    assert "straggler: rank 1" in report, report
    waits = {r["rank"]: r["exposed_comm_s"] for r in slow.summary["ranks"]}
    # 4 timed steps × 40 ms; half of it as the bar: a loaded machine also delays rank 0's own compute
    assert waits[0] > waits[1] + 0.02 * 4, ("rank 0 waits ~40 ms per timed step for rank 1", waits)
