"""The true peak (issue 49): the CPU allocator's high-water mark of a measured step — every allocation and free,
not only the snapshots' instants (`--profile-memory`: measure/memory_profile.py) — explained by the categories in
effect at that moment, and predicted.

A model with a large vocabulary and a small width (V = 32768, h = 64) puts the step's true peak at the start of the
loss's backward, where the logits, their gradient and the loss's fp32 block are alive beside every activation: the
bytes no category named before the `loss` category (58 % of this model's peak). Tolerances: the categories explain
the true peak within 1 % (what is left: small autograd temporaries alive at that instant, 0.0–0.4 % measured), the
prediction within 2 % (it leaves out Adam's step counters). ZeRO-1 on gloo once left a whole bucket unattributed on
one rank or another (gloo's blocking reduce-scatter kept its copy of the input alive in a reference cycle until the
garbage collector ran): comm/traced.py now releases that copy itself, and this test is what catches it."""

import pytest

from workbench.config import ModelConfig

WIDE_VOCABULARY = ModelConfig(vocab_size=32768, hidden=64, layers=2, heads=4, seq_len=64)
PROFILED = {
    "model": WIDE_VOCABULARY,
    "global_batch": 8,
    "steps": 2,
    "profile_memory": True,
    "profile_memory_step": 1,
}
CASES = {
    "dp2": {"dp": 2},
    "zero1": {"dp": 2, "zero": 1},
    "zero2": {"dp": 2, "zero": 2},
    "zero3": {"dp": 2, "zero": 3},
    "tp2 (vocabulary-parallel loss)": {"tp": 2},
    "pp2 (the last stage)": {"pp": 2, "microbatches": 2},
}


def explained(rank: dict, tolerance: float) -> bool:
    """Whether the categories at the allocator's true peak explain it within `tolerance` of it."""
    peak = rank["true_peak"]
    return abs(peak["unattributed"]) <= tolerance * peak["allocated"]


@pytest.mark.parametrize("case", list(CASES))
def test_the_categories_explain_and_the_formulas_predict_the_true_peak(launched, case):
    run = launched(**PROFILED, **CASES[case], name=f"true-peak-{case.split()[0]}")
    last = max(r["pp"] for r in run.summary["ranks"])
    for r in run.summary["ranks"]:
        if r["pp"] != last:
            continue  # a first pipeline stage's peak is the embedding's backward: its dense gradient is unnamed
        peak = r["true_peak"]
        assert peak["categories"]["loss"] > 0.5 * peak["allocated"], (
            "the peak falls at the loss's backward"
        )
        assert explained(r, 0.01), (case, r["rank"], peak)
        measured = peak["allocated"] - peak["backend_threads"]
        assert abs(measured - r["predicted_peak_total_bytes"]) <= 0.02 * measured, (
            case,
            r["rank"],
            measured,
            r["predicted_peak_total_bytes"],
        )
        assert r["peak_bytes"]["loss"] == r["predicted_bytes"]["loss"], (
            "the loss's bytes, to the byte"
        )


def _peak_with_an_unnamed_temporary(rank: int, world: int, run_dir: str, extra: int) -> None:
    """One process, profiled, with `extra` bytes allocated at the loss's peak and told to no one."""
    import os

    import torch

    from tests.test_true_peak import PROFILED
    from workbench.analysis.summary import memory_figures
    from workbench.config import RunConfig
    from workbench.engine.context import setup
    from workbench.engine.train import train
    from workbench.model import cross_entropy

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    report = cross_entropy.report_peak
    held = []

    def with_a_leak(memory, *tensors):
        held.append(torch.ones(extra // 4))  # alive at the snapshot, in no category
        report(memory, *tensors)
        held.clear()

    cross_entropy.report_peak = with_a_leak if extra else report
    # dp2 rank's step
    ctx = setup(RunConfig(**{**PROFILED, "global_batch": 4}, backend="gloo").validate(), run_dir)
    train(ctx, attempt=0)
    peak = memory_figures(ctx.recorder.events)["true_peak"]
    found = explained({"true_peak": peak}, 0.01)
    assert found == (extra == 0), (extra, peak)
    if extra:
        assert peak["unattributed"] >= extra, peak


def test_an_unnamed_temporary_of_1_percent_of_the_peak_is_caught(tmp_path):
    """A temporary of 1.2 % of the true peak (about 2 MiB of ~165), alive at it and counted nowhere, fails the
    check (the same step without it passes: the dp2 case above is this step on each rank)."""
    from tests.distributed import run_ranks

    run_ranks(_peak_with_an_unnamed_temporary, 1, str(tmp_path), int(0.012 * 165 * 2**20))
