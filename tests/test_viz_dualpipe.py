"""Notebook 03's DualPipe section, checked without a notebook: the README's formulas beside the simulation
(exact where they are, an estimate elsewhere), the simulator's charts and sliders, and what a DualPipeV
run's trace says about its pairs, its bubble and the micro-batch-stages it holds."""

import math

import pytest

from workbench import viz
from workbench.config import ModelConfig
from workbench.schedules.build import build_schedule, peak_in_flight
from workbench.viz import dualpipe, dualpipe_runs
from workbench.viz.pipeline import bubble_explorer


def test_the_readme_formula_is_exact_at_equal_costs_and_an_estimate_elsewhere():
    """At F = I = W with B ≤ F&B ≤ F + B the simulation at free transfers is the README's bubble; with W
    shorter than I DualPipeV idles less than it says, with F&B shorter than B more."""
    rows = dualpipe.formula_table(ps=(2, 4))
    sim, formula = "idle per rank, simulated (free transfers)", "README's formula"
    for r in rows:
        if r["case"].startswith("F = I = W"):
            assert r[sim] == pytest.approx(r[formula], abs=1e-9), r
    at4 = {r["case"]: r for r in rows if r["schedule"] == "DualPipeV" and r["P ranks"] == 4}
    assert at4["W shorter than I"][sim] < at4["W shorter than I"][formula]
    assert at4["F&B shorter than B"][sim] > at4["F&B shorter than B"][formula]
    # NCCL's rule (a send may wait for its receive) adds idle time the formula does not count
    assert (
        at4["F = I = W, nothing overlaps"]["simulated under NCCL's rule"]
        > at4["F = I = W, nothing overlaps"][sim]
    )


@pytest.mark.parametrize(("name", "p", "expected"), [("1f1b", 4, 9.0), ("zbh1", 4, 3.0)])
def test_the_readme_rows_for_1f1b_and_zb1p_are_their_simulated_idle(name, p, expected):
    """(PP − 1)(F + B) and (PP − 1)(F + B − 2W) at F = 1, B = 2, W = 1: what the notebook's bubble table
    puts beside 1F1B's and ZB-H1's measured idle."""
    tl = dualpipe.timeline(name, p, 2 * p, t_f=1.0, t_b=2.0, t_w=1.0)
    assert dualpipe_runs.idle_per_rank(tl) == expected
    assert dualpipe.readme_idle(name, p, t_f=1.0, t_b=2.0, t_w=1.0) == expected
    assert dualpipe.readme_idle("zbv", p, t_f=1.0, t_b=2.0, t_w=1.0) is None


def test_beside_draws_the_four_schedules_with_every_pair_outlined():
    fig = dualpipe.beside(4, 8, t_fb=2.0)
    titles = [a.text for a in fig.layout.annotations]
    assert [t.split(":")[0] for t in titles] == ["1F1B", "ZBV", "DualPipeV", "DualPipe"]
    assert "idle per rank 1.50 — README's formula 1.50" in titles[2]
    outlines = [t for t in fig.data if t.name == "F&B pair (outlined)"]
    boxes = sum(list(t.x).count(None) for t in outlines)
    pairs = sum(
        len({a.pair for a in rank if a.pair is not None})
        for name in ("dualpipev", "dualpipe")
        for rank in build_schedule(name, 4, 8).actions
    )
    assert len(outlines) == 2 and boxes == pairs > 0


def test_the_sliders_keep_p_and_m_where_dualpipe_accepts_them():
    """Choosing DualPipe makes p even and m even and at least 2p; DualPipeV m at least 2p; the DualPipe
    explorer's m follows its P."""
    box = bubble_explorer()
    schedule, (p, m) = box.children[0].children[0], box.children[1].children[:2]
    schedule.value = "dualpipe"
    p.value = 3
    assert (p.value, m.min, m.step) == (4, 8, 2) and m.value >= 8 and m.value % 2 == 0
    schedule.value = "dualpipev"
    p.value = 5
    assert m.min == 10 and m.value >= 10
    explorer = dualpipe.dualpipe_explorer()
    p, m = explorer.children[0].children
    p.value = 8
    assert m.min == 16 and m.value >= 16


def test_a_dualpipev_runs_pairs_bubble_and_activations_from_its_trace(launched):
    """Every pair ran its F, then its B; the measured F&B is its F's and B's compute; at each rank's
    activation peak it held PP + 1 = 5 micro-batch-stages, as the schedule walk says; the tables show no
    missing value."""
    run = launched(model=ModelConfig(layers=4), pp=2, schedule="dualpipev", microbatches=4)
    pairs = dualpipe_runs.pairs(run)
    per_rank = [
        len({a.pair for a in rank if a.pair is not None})
        for rank in build_schedule("dualpipev", 2, 4).actions
    ]
    steps = pairs.step.nunique()
    assert [len(pairs[pairs["rank"] == r]) for r in (0, 1)] == [n * steps for n in per_rank]
    assert (pairs["B starts after F ends by (ms)"] >= 0).all()
    cost = dualpipe_runs.measured_costs(run)
    assert set(cost) == {"F", "B", "I", "W", "F&B"}
    assert cost["F&B"] == pytest.approx((pairs["F ms"] + pairs["B ms"]).mean())
    walked = peak_in_flight(build_schedule("dualpipev", 2, 4))
    assert [dualpipe_runs.held_at_peak(run, r) for r in (0, 1)] == walked == [5, 5]
    for table in (
        dualpipe_runs.bubble_table({"v": run}),
        dualpipe_runs.memory_table({"v": run}),
    ):
        assert not table.isna().any().any()
    row = dualpipe_runs.bubble_table({"v": run}).iloc[0]
    formula = (4 / 2 - 1) * (cost["F&B"] + cost["B"] - 3 * cost["W"])
    assert math.isclose(row["README's formula, measured costs (ms)"], formula, abs_tol=0.006)
    fig = viz.planned_vs_measured(run)
    # the pairs outlined in the plan and in the measured step
    assert len(fig.layout.shapes) == 2 * sum(per_rank)
