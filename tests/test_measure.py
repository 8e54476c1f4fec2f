"""Measured and fast steps (measure/schedule.py): the same training whatever the schedule, and a fast step
that measures nothing — no saved-tensor hook, no allocator read, no device synchronisation, one read of the
loss. The GPU half is proven on the CPU with stand-ins: a device clock whose synchronisations are counted
(comm/device_timing.DeviceClock with fake events, as tests/test_device_timing.py), an allocator whose reads
are counted, and the fused AdamW — the CUDA update, whose skip and clipping never ask the host — which torch
also runs on the CPU."""

from __future__ import annotations

import pytest

from tests.distributed import run_ranks
from workbench import ConfigError, RunConfig
from workbench.measure.schedule import measure_schedule
from workbench.trace.validate import validate_run


def test_auto_measures_every_step_on_a_cpu_and_three_after_the_warm_up_on_a_gpu():
    assert [measure_schedule("auto", 8, "cpu").measured(s) for s in range(8)] == [True] * 8
    gpu = measure_schedule("auto", 12, "cuda", warmup_excluded=1)
    assert [s for s in range(12) if gpu.measured(s)] == [1, 2, 3]
    assert [s for s in range(2) if measure_schedule("auto", 2, "cuda", 5).measured(s)] == [1], (
        "a short run: its last"
    )
    assert not any(measure_schedule("auto", 8, "cpu", trace=False).measured(s) for s in range(8)), (
        "nothing recorded"
    )
    assert measure_schedule("2:4", 8, "cpu", also=(6,)).describe() == "2, 3, 6"


@pytest.mark.parametrize("bad", ["some", "3:2", "0:99", "1-3"])
def test_a_bad_schedule_is_refused_before_launch_naming_what_is_valid(bad):
    with pytest.raises(ConfigError, match=rf"measure={bad!r}.*'A:B'"):
        RunConfig(steps=8, measure=bad).validate()


def test_losses_are_identical_whatever_is_measured(launched):
    """dp = 2 with bucketed all-reduces: every step measured, none, and steps 1 and 2 only — the same losses and
    gradient norms, bit for bit. The summary says which steps its figures come from and what measuring costs."""
    runs = {spec: launched(dp=2, bucket_mb=0.01, measure=spec) for spec in ("all", "none", "1:3")}
    base = runs["all"].metrics
    for spec, run in runs.items():
        assert run.metrics.loss.tolist() == base.loss.tolist(), spec
        assert run.metrics.grad_norm.tolist() == base.grad_norm.tolist(), spec
        assert validate_run(run.path) == [], spec
    mixed = runs["1:3"]
    assert mixed.metrics.measured.tolist() == [False, True, True, False, False, False]
    r = mixed.summary["ranks"][0]
    assert r["measured_steps"] == [1, 2] and r["fast_steps"] == [3, 4, 5]
    assert r["step_time_s"] == r["step_time_fast_s"] and r["measure_cost"] > 0
    assert mixed.summary["figures_from"]["memory"] == "measured steps [1, 2]"
    assert (
        r["peak_bytes"]["activation"]
        == runs["all"].summary["ranks"][0]["peak_bytes"]["activation"]
        > 0
    )
    assert runs["none"].summary["ranks"][0]["peak_bytes"].get("activation", 0) == 0, (
        "nothing measured, no memory"
    )


def _count_what_each_step_does(rank: int, world: int, run_dir: str, precision: str) -> None:
    """Step 0 measured, steps 1..3 fast, under the stand-ins; asserts on the counts."""
    import functools
    import os
    from collections import Counter

    import torch

    from tests.test_device_timing import FakeEvent
    from workbench.comm.device_timing import DeviceClock
    from workbench.engine.batches import Batches
    from workbench.engine.context import setup
    from workbench.engine.parallelize import parallelize
    from workbench.engine.train_step import train_step
    from workbench.optim import adamw

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    counts: Counter = Counter()
    # the CUDA update
    adamw.AdamW.__init__ = functools.partialmethod(adamw.AdamW.__init__, fused=True)
    cfg = RunConfig(
        model="tiny", steps=4, precision=precision, backend="gloo", grad_clip=0.5
    ).validate()
    ctx = setup(cfg, run_dir)
    rec = ctx.recorder
    clock = DeviceClock(
        rec.now_us,
        synchronize=lambda: counts.update(["synchronize"]),
        event=lambda: FakeEvent(rec.now_us),
        measured=lambda: rec.measured,
        sync_compute=lambda: counts.update(["sync_compute"]),
    )
    rec.device_clock = ctx.comm.clock = clock
    ctx.memory.device = torch.device("cuda")  # its snapshots read the (counted) allocator
    for name in (
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "reset_peak_memory_stats",
    ):
        setattr(torch.cuda, name, lambda *a, _n=name, **k: counts.update(["allocator"]) or 0)
    hooks = torch.autograd.graph.saved_tensors_hooks

    class CountedHooks(hooks):
        def __init__(self, *args):
            counts.update(["saved_tensors_hooks"])
            super().__init__(*args)

    torch.autograd.graph.saved_tensors_hooks = CountedHooks
    # each one a host synchronisation on CUDA
    for method in (
        "item",
        "tolist",
        "__bool__",
        "__float__",
    ):
        original = getattr(torch.Tensor, method)
        setattr(
            torch.Tensor,
            method,
            lambda t, *a, _o=original, _m=method: counts.update(["read"]) or _o(t, *a),
        )
    strategy = parallelize(cfg, ctx)
    batches = Batches(cfg, ctx.device, dp_index=0, dp_size=1)
    per_step = []
    for step in range(4):
        counts.clear()
        result = train_step(strategy, batches, step, config=cfg, measured=step == 0)
        per_step.append(dict(counts))
        assert result.grad_norm is not None and result.grad_norm > 0
    measured, fast = per_step[0], per_step[1:]
    assert (
        measured["saved_tensors_hooks"] >= 1
        and measured["allocator"] > 0
        and measured["sync_compute"] >= 3
    )
    for counted in fast:
        # no hook, no allocator, no synchronisation: one read
        assert counted == {"read": 1}, counted
    spans = [e for e in rec.events if e.get("ph") == "X" and e["args"].get("step") == 3]
    assert {"forward", "backward", "optimizer"} <= {e["name"] for e in spans}, (
        "a fast step's spans, from events"
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_fast_step_pushes_no_hook_reads_no_allocator_and_waits_once(tmp_path, precision):
    run_ranks(_count_what_each_step_does, 1, str(tmp_path), precision)


def test_the_cli_takes_the_schedule_and_compile():
    from workbench.cli.run_command import parse_run

    config, _ = parse_run(["--measure", "2:5", "--compile", "--steps", "8"])
    assert config.validate().measure == "2:5" and config.compile is True
    assert parse_run([])[0].measure == "auto"


def _final_evaluation_is_written(rank: int, world: int, run_dir: str) -> None:
    """Steps 1.. fast under a device clock with fake events: the evaluation after the last step is a fast span,
    deferred to a step end that never comes unless training ends by writing it."""
    import os

    from tests.test_device_timing import FakeEvent
    from workbench.comm.device_timing import DeviceClock
    from workbench.engine.context import setup
    from workbench.engine.train import train

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    cfg = RunConfig(
        model="tiny", steps=3, backend="gloo", measure="0:1", eval_every=2, eval_batches=1
    ).validate()
    ctx = setup(cfg, run_dir)
    rec = ctx.recorder
    rec.device_clock = ctx.comm.clock = DeviceClock(
        rec.now_us,
        synchronize=lambda: None,
        sync_compute=lambda: None,
        event=lambda: FakeEvent(rec.now_us),
        measured=lambda: rec.measured,
    )
    train(ctx, attempt=0)
    evaluations = [
        e["args"]["step"] for e in rec.events if e.get("ph") == "X" and e["name"] == "evaluate"
    ]
    assert evaluations == [1, 2], evaluations
    assert ctx.comm.clock.spans == [], "nothing left waiting for its times"


def test_the_last_step_s_deferred_spans_are_written(tmp_path):
    run_ranks(_final_evaluation_is_written, 1, str(tmp_path))
