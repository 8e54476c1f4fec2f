"""The charts read run directories and never need torch.distributed."""

import subprocess
import sys

import pytest

from workbench import viz
from workbench.analysis.collectives import bandwidth_by_size, collectives
from workbench.launching.launcher import ring_demo
from workbench.viz.ring import SENT, replay, ring_collectives


def test_charts_build_from_a_run(launched):
    run = launched(dp=2, bucket_mb=0.01)
    ring = launched(dp=2, allreduce="ring", bucket_mb=0.03)
    fig = viz.timeline(run)
    rows = set(fig.data[0].y) | {y for t in fig.data for y in t.y}
    assert {"rank 0 · compute", "rank 0 · comm in flight", "rank 1 · wait"} <= rows
    assert len(viz.ring_steps(ring).layout.sliders[0].steps) == 2 * (2 - 1) + 1
    assert {t.name for t in viz.memory_breakdown(run).data} >= {
        "parameter",
        "gradient",
        "optimizer_state",
    }
    assert len(viz.memory_over_time(run).data) >= 4
    assert len(viz.loss_curves({"a": run, "b": ring}, baseline="a").data) == 3
    assert len(viz.overlap_table(run)) == 2
    assert (collectives(run).op == "all_reduce").all()
    assert len(bandwidth_by_size(ring)) > 0


@pytest.mark.slow  # notebook 01 checks this replay of its dp4 ring run in make test
def test_ring_replay_ends_with_every_chunk_complete_on_every_rank(launched):
    run = launched(dp=4, allreduce="ring", bucket_mb=0.03)
    ev = run.events
    ring = ev[ev.cat == "ring_step"]
    one = ring[
        (ring.step == ring.step.max()) & (ring.seq == ring[ring.step == ring.step.max()].seq.min())
    ]
    states = replay(one, 4)
    assert len(states) == 2 * 3 + 1
    assert all(len(chunk) == 1 for row in states[0] for chunk in row)
    after_rs = states[3]
    assert sorted(max(len(c) for c in row) for row in after_rs) == [4, 4, 4, 4]
    assert all(len(chunk) == 4 for row in states[-1] for chunk in row)


@pytest.mark.slow  # notebook 09 replays the 4-rank demo's rings to their ends, bytes checked, in make test
def test_every_ring_collective_replays_to_its_result(tmp_path):
    """The four rings of engine/ring_demo.py (each checked there against the backend's collective),
    replayed from their spans: all-reduce leaves every chunk summed on every rank, reduce-scatter
    chunk i summed on rank i, all-gather and broadcast every chunk everywhere; and the bytes the
    busiest rank sent equal the formula."""
    run = ring_demo(3, 2, out=str(tmp_path / "ring"))
    table = ring_collectives(run)
    assert list(table.op) == ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]
    ev = run.events
    for row in table.itertuples():
        steps = ev[(ev.cat == "ring_step") & (ev.seq == row.seq)]
        last = replay(steps, 3, row.op, source=0)[-1]
        full = {0, 1, 2}
        if row.op == "reduce_scatter":
            assert all(last[r][r] == full for r in range(3))
        elif row.op == "all_reduce":
            assert all(c == full for rank in last for c in rank)
        else:
            assert all(c for rank in last for c in rank)
        sent = steps.groupby("rank").bytes.sum().max()
        assert sent == SENT[row.op](3) * row.bytes, (row.op, sent, row.bytes)
        last = viz.ring_steps(run, op=row.op).layout.sliders[0].steps[-1]
        # {"title": {"text": …}}: the form plotly.js accepts from a slider (a bare string removed the title)
        assert f"{int(sent)} B each (formula)" in last.args[1]["title"]["text"]


def test_loading_and_charting_does_not_import_torch_distributed(launched):
    run = launched(dp=2, bucket_mb=0.01)
    code = (
        f"import sys, workbench as wb; from workbench import viz; r = wb.load({run.path!r}); "
        "viz.timeline(r); viz.memory_breakdown(r); r.metrics; r.summary; "
        "assert 'torch.distributed' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pipeline_charts(launched):
    from workbench.config import ModelConfig
    from workbench.viz.pipeline import bubble_explorer

    run = launched(model=ModelConfig(layers=4), pp=2, schedule="1f1b", microbatches=4)
    fig = viz.planned_vs_measured(run)
    labels = {t.text for t in fig.data if t.text}
    assert {"0F0", "1B3"} <= labels
    assert "bubble" in viz.planned("interleaved", 4, 8, 2).layout.title.text
    assert len(viz.bubble_vs_m([run]).data) == 2
    assert bubble_explorer() is not None


def test_zero_charts_and_the_papers_example(launched):
    from workbench.viz.zero import formula_explorer

    runs = {"dp": launched(dp=2), "zero3": launched(dp=2, zero=3)}
    assert len(viz.stages_side_by_side(runs).data) >= 3
    fig = viz.formula_figure(7.5e9, 64, "mixed")
    totals = [t for t in fig.data if t.type == "scatter"][0].text
    assert list(totals) == ["120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"]
    assert formula_explorer() is not None
