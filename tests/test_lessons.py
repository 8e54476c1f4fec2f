"""The pieces the notebooks' lessons stand on, checked without a notebook: `viz.check`, the α–β fit, the
categories at the simultaneous peak, one colour per span kind and per run, the straggler read-out, the
planner's step-time split, transfers in the bubble explorer."""

import importlib
import json

import numpy as np
import pytest

from workbench import viz
from workbench.analysis.summary import memory_figures
from workbench.studies.comm_calibration import alpha_beta
from workbench.viz.check import CheckFailed, headroom
from workbench.viz.palette import SPAN_COLORS, UNKNOWN, span_color

# the module (viz.check is the function)
check_module = importlib.import_module("workbench.viz.check")


def test_check_prints_the_claim_and_raises_only_under_test(monkeypatch, capsys):
    monkeypatch.delenv("WORKBENCH_CHECKS", raising=False)
    assert viz.check("two is more than one", "a > b", a=2, b=1.0)
    # a learner's run: printed, not raised
    assert not viz.check("one is more than two", "a > 2", a=1)
    out = capsys.readouterr().out
    assert (
        "✓ two is more than one  (a = 2, b = 1)" in out and "✗ one is more than two  (a = 1)" in out
    )
    monkeypatch.setenv("WORKBENCH_CHECKS", "raise")
    with pytest.raises(CheckFailed, match="one is more than two"):
        viz.check("one is more than two", "a > 2", a=1)


def test_a_timing_claim_is_shown_with_its_margin_and_reason_and_never_raised(monkeypatch, capsys):
    """Under test an asserted ✗ raises; a timing claim's ✗ is printed with its margin and why it can move."""
    monkeypatch.setenv("WORKBENCH_CHECKS", "raise")
    slow, fast = 12.0, 10.0
    assert not viz.check(
        "fast is slower",
        "fast > slow",
        timing="two runs on shared cores",
        margin=headroom(fast, slow, below=False),
        fast=fast,
        slow=slow,
    )
    out = capsys.readouterr().out
    assert (
        "✗ fast is slower  (fast = 10, slow = 12)  [margin -17%]  [timing claim, shown not asserted: two runs "
        "on shared cores]"
    ) in out
    with pytest.raises(CheckFailed):
        viz.check(
            "fast is slower",
            "fast > slow",
            margin=headroom(fast, slow, below=False),
            fast=fast,
            slow=slow,
        )


def test_headroom_is_the_share_a_value_clears_its_limit_by():
    assert headroom(7, 10) == pytest.approx(0.3) and headroom(13, 10) == pytest.approx(-0.3)
    assert headroom(13, 10, below=False) == pytest.approx(0.3) and headroom(0.5, 0) == -0.5


def test_in_a_notebook_each_check_displays_its_ledger_record(monkeypatch):
    """The record beside the line is what scripts/claims_ledger.py reads from an executed notebook."""
    shown = []
    monkeypatch.setattr(check_module, "_show", lambda line, record: shown.append((line, record)))
    viz.check("a claim", "ratio < 1", regime="2 ranks", margin=0.25, ratio=np.float64(0.5))
    ((line, record),) = shown
    assert (
        line.startswith("✓ a claim") and record["regime"] == "2 ranks" and record["margin"] == 0.25
    )
    assert record["numbers"] == {"ratio": 0.5} and type(record["numbers"]["ratio"]) is float
    assert record["holds"] == "ratio < 1" and record["fails_on"] == "ratio = 1.5"
    assert json.loads(json.dumps(record)) == record


@pytest.mark.parametrize(
    ("holds", "numbers", "fails_on"),
    [
        ("measured == predicted", {"measured": 1000, "predicted": 1000}, "measured = 1050"),
        (
            "difference <= 1e-5 * loss",
            {"difference": [0.0, 2e-7], "loss": [3.1, 3.0]},
            "difference[0] = 1",
        ),
        ("ratio_low > 1 > ratio_high", {"ratio_low": 1.9, "ratio_high": 0.8}, "ratio_low = 0.9"),
        ("abs(share - 0.25) < 0.02", {"share": 0.25}, "share = 1.25"),
        (
            "list(np.flatnonzero(skipped)) == [3]",
            {"skipped": [False, False, False, True]},
            "skipped[0] = True",
        ),
        (
            "'straggler: rank 1' in verdict",
            {"verdict": "straggler: rank 1 (40 ms a step)"},
            'verdict = ""',
        ),
        ("all(np.diff(total_MB) < 0)", {"total_MB": [9.0, 5.0, 3.0]}, "total_MB[0] = 4.5"),
        ("dropped == 0", {"dropped": [0, 0, 0]}, "dropped[0] = 1"),
    ],
)
def test_every_kind_of_check_is_shown_failing_on_a_wrong_value(
    holds, numbers, fails_on, monkeypatch
):
    """Each condition the notebooks use (an equality to the byte, a tolerance over a table, a bracket, an
    interval, a flag, a verdict's text, a trend, a count) holds on its numbers and fails on the first wrong
    value `check` finds; that value, put back into the condition, makes it false."""
    shown = []
    monkeypatch.setattr(check_module, "_show", lambda line, record: shown.append(record))
    monkeypatch.setenv("WORKBENCH_CHECKS", "raise")
    assert viz.check("a claim", holds, **numbers)
    assert shown[0]["fails_on"] == fails_on


@pytest.mark.parametrize(
    ("holds", "numbers"),
    [
        ("True", {}),  # a constant
        ("peak <= peak", {"peak": 4.0}),  # true of every value
        # no wrong value of an element changes a length
        (
            "len(steps) == 3",
            {"steps": [1.0, 2.0, 3.0]},
        ),
        ("flag or not flag", {"flag": True}),
    ],
)
def test_a_check_that_cannot_fail_is_an_error_under_test(holds, numbers, monkeypatch, capsys):
    monkeypatch.delenv("WORKBENCH_CHECKS", raising=False)
    assert viz.check("a tautology", holds, **numbers)  # a learner's run: shown
    monkeypatch.setenv("WORKBENCH_CHECKS", "raise")
    with pytest.raises(CheckFailed, match="this check cannot fail"):
        viz.check("a tautology", holds, **numbers)


def test_a_condition_must_be_stated_over_the_numbers():
    with pytest.raises(TypeError, match="state the condition as an expression over its numbers"):
        viz.check("two is more than one", 2 > 1)


def test_the_alpha_beta_fit_recovers_its_line_and_weights_every_size():
    """t = α + 2(n−1)/n·S/β exactly, from 1 KB to 64 MB: α and β come back; with one size 20 % off, α
    (set by the small sizes) stays within 10 % — a plain least-squares fit would follow the large ones."""
    alpha, beta, n = 50e-6, 2e9, 4
    sizes = [1 << k for k in range(10, 27, 2)]
    exact = {s: alpha + 2 * (n - 1) / n * s / beta for s in sizes}
    a, b = alpha_beta(exact, n)
    assert a == pytest.approx(alpha, rel=1e-9) and b == pytest.approx(beta, rel=1e-9)
    noisy = {**exact, sizes[-1]: exact[sizes[-1]] * 1.2}
    assert alpha_beta(noisy, n)[0] == pytest.approx(alpha, rel=0.1)


def test_the_categories_at_the_simultaneous_peak_sum_to_it():
    """Activations peak at one snapshot, gradients at another: the stack at the total's peak is what a rank
    pays, and is less than the stack of each category's own peak."""
    snaps = [
        {"activation": 10, "gradient": 0},
        {"activation": 2, "gradient": 6},
        {"activation": 0, "gradient": 7},
    ]
    events = [{"ph": "C", "name": "memory", "ts": float(i), "args": a} for i, a in enumerate(snaps)]
    m = memory_figures(events)
    assert (
        m["bytes_at_peak_total"] == {"activation": 10, "gradient": 0}
        and m["peak_total_bytes"] == 10
    )
    assert sum(m["peak_bytes"].values()) == 17 > sum(m["bytes_at_peak_total"].values())


def test_timelines_colour_transfers_in_flight_apart_from_waits_and_blocking_collectives(launched):
    """One palette: a blocking collective, an asynchronous one in flight and a wait are three colours, the
    palette's; and the legend of compare's timelines gives each kind once, in that colour."""
    run = launched(dp=2, bucket_mb=0.01)
    colors = {t.name: t.marker.color for t in viz.timeline(run).data}
    assert {"collective in flight", "wait"} <= set(colors)
    assert len({colors["collective in flight"], colors["wait"], SPAN_COLORS["collective"]}) == 3
    assert all(colors[k] == SPAN_COLORS[k] for k in colors if k in SPAN_COLORS)
    # every kind has its own
    assert UNKNOWN not in colors.values() and span_color("p2p in flight") != UNKNOWN


@pytest.mark.slow  # make test-browser checks every loss chart's marks against its legend in CI
def test_loss_curves_draw_each_runs_differences_in_its_own_colour(launched):
    a, b, c = launched(steps=2), launched(dp=2, steps=2), launched(dp=2, steps=2, bucket_mb=0.01)
    fig = viz.loss_curves({"one": a, "two": b, "three": c}, baseline="one")
    by_run: dict[str, set] = {}
    for t in fig.data:
        if t.name != "one":
            by_run.setdefault(t.name, set()).add(t.marker.color)
    assert (
        all(len(v) == 1 for v in by_run.values())
        and len({next(iter(v)) for v in by_run.values()}) == 2
    )


def test_the_planners_terms_add_up_to_its_step_time():
    import workbench as wb
    from workbench.predict.estimator import A100_80GB, GPT3_175B

    p = wb.plan(GPT3_175B, wb.Cluster(96, A100_80GB), global_batch=1536, zero_stages=(0,))
    top = p.candidates.head(5)
    total = top[["compute_s", "tp_s", "pipeline_s", "dp_s", "other_s"]].sum(axis=1)
    assert (abs(total - top.step_time_s) < 1e-9 * top.step_time_s).all()
    # says why not
    assert not any("would need" in line and "fits." in line for line in p.explanation), (
        p.explanation
    )


def test_transfers_grow_the_bubble_beyond_the_formula():
    from workbench.viz.pipeline import planned

    free, costly = planned("1f1b", 4, 8), planned("1f1b", 4, 8, t_comm=0.3)
    assert (
        "0.273 of the step (formula" in free.layout.title.text
        and "each takes 0.3" in costly.layout.title.text
    )
    assert list(free.layout.yaxis.ticktext) == [
        "rank 0 · 4",
        "rank 1 · 3",
        "rank 2 · 2",
        "rank 3 · 1",
    ]


def test_a_long_error_message_is_cut_at_a_word():
    from workbench.analysis.doctor import _shortened

    cut = _shortened("word " * 200)
    assert len(cut) <= 402 and cut.endswith(" …") and "wor …" not in cut


def test_a_timeline_of_chosen_steps_keeps_their_recomputation(launched):
    """Recompute spans carry no step number; the step filter used to drop them, so that the full
    recomputation timeline showed none. They are kept when they lie inside the chosen steps' window."""
    run = launched(recompute="full")
    last = int(run.events.step.max())
    assert "recompute" in {t.name for t in viz.timeline(run, steps=[last]).data}


def _ledger():
    import sys
    from pathlib import Path

    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import claims_ledger

    return claims_ledger


def _claim(claim: str, *, held: bool = True, timing: str | None = None) -> dict:
    return {
        "claim": claim,
        "held": held,
        "holds": "ratio < 1",
        "fails_on": "ratio = 1.5",
        "timing": timing,
        "margin": 0.3 if timing else None,
        "regime": "2 ranks",
        "cores": 2,
        "numbers": {"ratio": 0.5},
    }


def test_the_ledger_reads_each_check_from_an_executed_notebook_and_finds_a_stale_page():
    """Each check's record (its display's CLAIM_MIME) becomes a row; a page whose ledger lists other claims than
    the notebooks check is stale, line by line — `make docs` fails on it."""
    import nbformat

    ledger = _ledger()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x")]
    nb.cells[0].outputs = [
        nbformat.v4.new_output(
            "display_data", data={"text/plain": "✓ a | b", check_module.CLAIM_MIME: _claim("a | b")}
        ),
        nbformat.v4.new_output(
            "display_data",
            data={
                "text/plain": "✗ late",
                check_module.CLAIM_MIME: _claim("late", held=False, timing="shared cores"),
            },
        ),
    ]
    rows = ledger.claims(nb, "03_pipeline_parallel")
    assert [r["claim"] for r in rows] == ["a | b", "late"] and rows[0]["cell"] == 0
    page = ledger.with_ledger(f"# Lessons\n\n{ledger.START}\n{ledger.END}\n", rows)
    assert "| 03 | a \\| b | asserted | `ratio < 1` | ratio = 0.5 | ratio = 1.5 |" in page
    assert "timing (shown, not asserted): shared cores" in page
    assert (
        ledger.listed(page) == [("03", "a | b"), ("03", "late")] and ledger.stale(page, rows) == []
    )
    assert ledger.stale(page, rows[:1]) == ["in the ledger but not checked: 03 · late"]
    assert ledger.stale(page, [*rows, {**rows[0], "claim": "new"}]) == [
        "checked but not in the ledger: 03 · new"
    ]


def test_the_committed_ledger_lists_every_check_the_builders_write():
    """docs/lessons.md's ledger names every claim a notebook builder passes to viz.check as a plain string (the
    f-string claims vary by their values and are held by `make docs`, which reads the executed notebooks)."""
    import ast
    from pathlib import Path

    ledger = _ledger()
    root = Path(__file__).resolve().parent.parent
    listed = {claim for _, claim in ledger.listed((root / "docs" / "lessons.md").read_text())}
    missing = []
    for builder in sorted((root / "scripts").glob("build_notebook_*.py")):
        for cell in ast.walk(ast.parse(builder.read_text())):
            if isinstance(cell, ast.Call) and getattr(cell.func, "id", "") == "code":
                for call in ast.walk(ast.parse(cell.args[0].value)):
                    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "viz.check"):
                        continue
                    if isinstance(call.args[0], ast.Constant) and call.args[0].value not in listed:
                        missing.append(f"{builder.name}: {call.args[0].value}")
                    if not (
                        isinstance(call.args[1], ast.Constant)
                        and isinstance(call.args[1].value, str)
                    ):
                        missing.append(
                            f"{builder.name}: a condition that is not an expression over its numbers: "
                            f"{ast.unparse(call.args[1])}"
                        )
    assert not missing, missing
    section = (
        (root / "docs" / "lessons.md").read_text().split(ledger.START, 1)[1].split(ledger.END, 1)[0]
    )
    assert "nothing: it cannot fail" not in section


def test_a_prediction_says_how_far_off_it_was():
    from workbench.viz.predict import how_far_off, predict

    guess = predict("How many?", unit=" ms")
    assert "Type your prediction in the box above, then run this cell again" in guess.verdict(10.0)
    guess.box.value = "12"
    assert guess.verdict(10.0) == "You said 12 ms; measured 10 ms: 20% too high."
    # an answer counted, not read off a clock, says so
    assert guess.verdict(10.0, label="counted") == "You said 12 ms; counted 10 ms: 20% too high."
    guess.box.value = "not a number"
    assert guess.value is None
    assert (
        how_far_off(5, 10) == "50% too low"
        and how_far_off(3, 3) == "exact"
        and how_far_off(1, 0) == "+1 off"
    )


def test_every_notebook_asks_first():
    """Each notebook's builder asks the learner for a number (viz.predict) before a run and reveals the measured
    answer after it (docs/changing-a-notebook.md)."""
    from pathlib import Path

    builders = sorted(
        (Path(__file__).resolve().parent.parent / "scripts").glob("build_notebook_*.py")
    )
    assert len(builders) >= 12
    silent = [
        b.name
        for b in builders
        if "viz.predict(" not in b.read_text() or ".reveal(" not in b.read_text()
    ]
    assert not silent, silent
