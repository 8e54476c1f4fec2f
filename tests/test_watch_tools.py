"""The tools people already watch training with: TensorBoard event files that hold metrics.jsonl's values,
and torch.profiler (Kineto) traces per rank that sit on our clock and that Holistic Trace Analysis loads."""

import json
import os

import pytest

import workbench as wb
from workbench.trace.torch_ops import MARKER, load_ops


@pytest.fixture(scope="module")
def watched(launched):
    """dp=2, TensorBoard on, torch.profiler over steps 2..3."""
    return launched(dp=2, steps=5, tensorboard=True, profile_steps="2:4")


def _scalars(run_dir: str) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(run_dir, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_tensorboard_holds_the_values_of_metrics_jsonl(watched):
    tb = _scalars(watched.path)
    m = watched.metrics.set_index("step")
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s"):
        assert set(tb[f"train/{key}"]) == set(m.index), key
        for step, value in tb[f"train/{key}"].items():
            assert value == pytest.approx(float(m.loc[step, key]), rel=1e-6), (key, step)
    # the split by the clock: compute and communication each measured, both positive, within the step
    for step in m.index:
        assert 0 < tb["time_ms/forward"][step] and 0 < tb["time_ms/backward"][step]
        assert (
            tb["time_ms/compute"][step]
            >= tb["time_ms/forward"][step] + tb["time_ms/backward"][step] - 1e-3
        )
        assert 0 < tb["time_ms/communication"][step]
        assert tb["time_ms/compute"][step] < 1e3 * m.loc[step, "step_time_s"] * 1.05
    peaks = watched.summary["ranks"][0]["peak_bytes"]
    assert tb["memory_MB/parameter"][max(m.index)] == pytest.approx(
        peaks["parameter"] / 1e6, rel=1e-6
    )
    assert tb["memory_MB/total"][max(m.index)] >= tb["memory_MB/parameter"][max(m.index)]


def test_torch_profiler_traces_are_per_rank_and_on_our_clock(watched):
    files = sorted(os.listdir(os.path.join(watched.path, "profile")))
    assert files == ["rank0.json", "rank1.json"], (
        "the directory holds only the per-rank traces (HTA reads it whole)"
    )
    for t in watched.traces:
        info = t["workbench"]
        with open(os.path.join(watched.path, info["torch_profile"]["file"])) as f:
            kineto = json.load(f)
        assert (
            kineto["distributedInfo"]["rank"] == info["rank"]
            and kineto["distributedInfo"]["world_size"] == 2
        )
        ops = load_ops(watched.path, info)
        assert any(o["name"] == "aten::mm" or o["name"] == "aten::addmm" for o in ops)
        # aligned: the profiled ops fall inside our spans of steps 2 and 3 on that rank
        ev = watched.events
        steps = ev[(ev["rank"] == info["rank"]) & (ev.cat == "step") & ev.step.isin([2, 3])]
        lo, hi = steps.start_us.min(), steps.end_us.max()
        mm = [o for o in ops if o["name"] in ("aten::mm", "aten::addmm")]
        inside = [o for o in mm if lo - 1e3 <= o["start_us"] <= hi + 1e3]
        assert len(inside) == len(mm), (
            f"{len(mm) - len(inside)} matmuls outside steps 2–3 on our clock"
        )
        assert not [o for o in ops if o["name"] == MARKER]


def test_the_timeline_overlays_the_torch_ops(watched):
    from workbench import viz

    fig = viz.timeline(watched, steps=[2], torch_ops=True)
    rows = {y for trace in fig.data for y in trace.y}
    assert "rank 0 · torch ops" in rows and "rank 1 · torch ops" in rows


def test_holistic_trace_analysis_reads_the_profile(watched, monkeypatch):
    """HTA loads every rank's file from its distributedInfo and sees the ops and our step numbers as its
    iterations (ProfilerStep#2, #3; HTA counts the complete ones). Its temporal and idle-time breakdowns
    analyse GPU kernel streams: on a CPU-only trace they fail inside HTA (IndexError / "No objects to
    concatenate"); docs/run-format.md says so. HTA parses here in this process: its default forks a pool
    from the test process, whose other threads (pyzmq's, once a notebook test has run) can hold a lock
    across the fork — a make test hung on it once, the forked child waiting on a futex forever."""
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    load = Trace.load_traces

    def in_process(self, *args, **kwargs):
        return load(self, *args, **{**kwargs, "use_multiprocessing": False})

    monkeypatch.setattr(Trace, "load_traces", in_process)

    analysis = TraceAnalysis(trace_dir=os.path.join(watched.path, "profile"))
    assert sorted(analysis.t.get_ranks()) == [0, 1]
    df = analysis.t.get_trace(0)
    names = set(analysis.t.symbol_table.sym_table[i] for i in df["name"].unique())
    assert "aten::mm" in names or "aten::addmm" in names
    iterations = {int(i) for i in analysis.t.get_iterations(0)}
    assert 2 in iterations and iterations <= {2, 3}, (
        "HTA's iterations are our step numbers (ProfilerStep#N)"
    )
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert sorted(overlap["rank"]) == [0, 1]


def test_wandb_offline_holds_the_config_each_steps_points_and_the_summary(tmp_path, monkeypatch):
    """--wandb without a login writes an offline run under RUN/wandb/ (read back here from its own records):
    the run's config, each step's loss equal to metrics.jsonl's, the summary's figures, and a table of the
    ranks."""
    import glob
    import json

    from tests.wandb_records import offline_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = wb.launch(
        wb.RunConfig(model="tiny", dp=2, global_batch=8, steps=3, wandb="workbench-test"),
        out=str(tmp_path / "r"),
        progress=False,
    )
    logged = offline_run(run.path)
    assert logged["config"]["dp"] == 2 and logged["config"]["wandb"] == "workbench-test"
    assert [row["train/loss"] for row in logged["history"]] == list(run.metrics.loss)
    assert logged["summary"]["workbench/world_size"] == 2
    assert logged["summary"]["workbench/step_time_s"] == run.summary["step_time_s"]
    (table,) = glob.glob(
        os.path.join(logged["dir"], "files", "media", "table", "workbench", "ranks_*.table.json")
    )
    with open(table) as f:
        ranks = json.load(f)
    assert [row[0] for row in ranks["data"]] == [0, 1] and ranks["columns"][0] == "rank"
