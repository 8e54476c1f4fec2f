"""Notebook 03's DualPipe section, checked without a notebook: the README's formulas beside the simulation
(exact where they are, an estimate elsewhere), the simulator's charts and sliders, and what a DualPipeV
run's trace says about its pairs, its bubble and the micro-batch-stages it holds."""

import math

import pytest

from workbench import viz
from workbench.analysis import dualpipe_runs
from workbench.config import ModelConfig
from workbench.schedules.build import build_schedule, peak_in_flight
from workbench.viz import bubble_split, dualpipe
from workbench.viz.pipeline import bubble_explorer


def test_the_readme_formula_is_exact_at_equal_costs_and_an_estimate_elsewhere():
    """At F = I = W with B ≤ F&B ≤ F + B the simulation at free transfers is the README's bubble; with W
    shorter than I DualPipeV idles less than it says, with F&B shorter than B more."""
    rows = dualpipe.formula_table(ps=(2, 4))
    sim, formula = dualpipe.SIMULATED, dualpipe.README
    for r in rows:
        if r["case"].startswith("F = I = W"):
            assert r[sim] == pytest.approx(r[formula], abs=1e-9), r
    at4 = {r["case"]: r for r in rows if r["schedule"] == "DualPipeV" and r["P ranks"] == 4}
    assert at4["W shorter than I"][sim] < at4["W shorter than I"][formula]
    assert at4["F&B shorter than B"][sim] > at4["F&B shorter than B"][formula]
    # NCCL's rule (a send may wait for its receive) adds idle time the formula does not count
    assert (
        at4["F = I = W, nothing overlaps"][dualpipe.UNDER_NCCL]
        > at4["F = I = W, nothing overlaps"][sim]
    )
    # the formula takes a stage's costs: half a rank's on DualPipeV's V, all of it on DualPipe
    at2 = {(r["schedule"], r["case"]): r for r in rows if r["P ranks"] == 2}
    assert at2["DualPipeV", "F = I = W, nothing overlaps"]["costs (a stage's)"] == (
        "F 0.5, B 1, W 0.5, F&B 1.5"
    )
    assert (
        at2["DualPipe", "F = I = W, nothing overlaps"]["costs (a stage's)"]
        == "F 1, B 2, W 1, F&B 3"
    )


def test_the_what_if_hides_a_share_of_f_and_i_in_a_pair_and_nothing_else():
    """A pair costs (1 − c)(F + I) + W; the schedules without pairs do not move with c; at c = 0 the pair
    costs F + B, as on one CPU thread."""
    costs = {"t_f": 2.0, "t_b": 4.0, "t_w": 1.0}  # I = 3
    assert dualpipe.pair_cost(costs, 0.5) == pytest.approx(0.5 * (2.0 + 3.0) + 1.0)
    assert dualpipe.pair_cost(costs, 0.0) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="c=0.6"):
        dualpipe.pair_cost(costs, 0.6)
    rows = dualpipe.what_if(costs, 2, 8, hidden=(0.0, 0.5))
    assert list(rows[0]) == [
        "pair hides c of F and I",
        *(f"{dualpipe_runs.LABELS[n]} step (ms)" for n in dualpipe.WHAT_IF),
    ]
    for n in ("1f1b", "zbh1", "zbv"):
        key = f"{dualpipe_runs.LABELS[n]} step (ms)"
        assert rows[0][key] == rows[1][key]
    assert rows[1]["DualPipeV step (ms)"] < rows[0]["DualPipeV step (ms)"]
    assert rows[0]["DualPipeV step (ms)"] == pytest.approx(
        dualpipe.timeline("dualpipev", 2, 8, **costs).makespan
    )


def test_zbvs_order_idles_more_with_m_once_w_is_shorter_than_i():
    """ZBV's order is generated at T_F = T_I = T_W: there its idle per rank is the start-up stagger, the
    same at every m; with W shorter than I it grows with m. DualPipeV's (P = 2) does not."""
    ms = (4, 8, 16)
    equal = dualpipe.idle_against_m({"t_f": 1.0, "t_b": 2.0, "t_w": 1.0}, 2, ms)
    short_w = dualpipe.idle_against_m({"t_f": 1.0, "t_b": 2.0, "t_w": 0.6}, 2, ms)
    assert len({round(r["ZBV"], 9) for r in equal}) == 1
    assert short_w[0]["ZBV"] < short_w[1]["ZBV"] < short_w[2]["ZBV"]
    assert len({round(r["DualPipeV"], 9) for r in short_w}) == 1


def test_torchs_grid_keeps_each_ranks_actions_in_its_own_row():
    """torch 2.13's add_schedule_op_spacing renumbers the ranks once one has no actions left; padded, each
    row holds its rank's actions in their order."""
    from workbench.viz.zero_bubble import torch_grid, torch_rows

    for name in ("zbh1", "zbv", "1f1b"):
        s = build_schedule(name, 2, 4)
        own = [[str(a) for a in rank if a.kind in ("F", "B", "I", "W")] for rank in s.actions]
        assert [[c for c in row if c] for row in torch_rows(s)] == own, name
    grid = torch_grid(build_schedule("zbh1", 2, 4))
    assert list(grid.index) == ["rank 0", "rank 1"] and grid.iloc[1].iloc[-1] == "1W3"


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
    assert math.isclose(row[dualpipe_runs.FORMULA_IDLE], formula, abs_tol=0.006)
    # pairs beside the same stages' unpaired actions, forwards by what ran before them, no missing value
    pairing = dualpipe_runs.pairing(run)
    assert pairing.pairs.sum() == len(pairs) and not pairing.isna().any().any()
    ratio = pairing["paired F + B ÷ unpaired"]
    assert all(r == "—" or r > 0 for r in ratio)
    after = dualpipe_runs.forwards_after(run)
    assert list(after.stage) == [0, 1, 2, 3] and not after.isna().any().any()
    assert list(after[after["holds the head"]].stage) == dualpipe_runs.head_stages(run) == [3]
    # counted in rank shares, a V's stage is half of one
    memory = dualpipe_runs.memory_table({"v": run})
    assert list(memory["= rank shares"]) == [2.5, 2.5]
    # the summary's split, by the notebook's names: its terms add up to the measured bubble; in ms each
    # is the share times the step's window
    share, ms = bubble_split.split(run), bubble_split.split_ms(run)
    assert list(share) == list(bubble_split.WORDS.values())
    assert sum(share.values()) == pytest.approx(run.summary["bubble_fraction"]["split"]["measured"])
    window = bubble_split.window_ms(run)
    assert window > 0 and all(ms[k] == pytest.approx(v * window) for k, v in share.items())
    assert "costs ≠ the formula's" in bubble_split.line(run)
    fig = viz.planned_vs_measured(run)
    # the pairs outlined in the plan and in the measured step
    assert len(fig.layout.shapes) == 2 * sum(per_rank)
