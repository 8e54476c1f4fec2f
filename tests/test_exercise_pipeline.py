"""The `pipeline` exercise: 1F1B as a table passes on real ranks; a deadlocking order and a missing or repeated
microbatch are named before any process starts; GPipe trains right and fails only the measured memory target;
a table that never fills the pipeline fails the simulated bubble.

The runs: the reference check launches three (the table, the workbench's 1F1B, one process: ~4 s, ~4 s, ~2 s on
an idle machine); the later checks into the same folder reuse the last two and launch only the learner's."""

from __future__ import annotations

import copy
import os
import types

import pytest

import workbench as wb
from workbench.exercises import answers
from workbench.exercises.pipeline import EXERCISE, judge
from workbench.exercises.pipeline_table import check_table, reference_table

ONE_F_ONE_B = answers.ANSWERS["pipeline"]
GPIPE = [[f"F{i}" for i in range(8)] + [f"B{i}" for i in range(8)] for _ in range(4)]
#: each microbatch through the whole pipeline before the next starts: valid, one microbatch held, a long bubble
SERIAL = [[x for i in range(8) for x in (f"F{i}", f"B{i}")] for _ in range(4)]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return str(tmp_path_factory.mktemp("pipeline"))


@pytest.fixture(scope="module")
def passed(out):
    return wb.exercises.check("pipeline", ONE_F_ONE_B, out=out)


def test_the_answer_is_1f1b_and_the_notebook_cells_hold_a_table():
    assert ONE_F_ONE_B == reference_table(4, 8), "the answer is the workbench's own 1F1B"
    cell: dict = {}
    exec(answers.source("pipeline"), cell)
    assert cell["one_f_one_b"] == ONE_F_ONE_B
    stub: dict = {}
    exec(EXERCISE.stub, stub)
    assert stub["one_f_one_b"] == [[], [], [], []]
    assert "rank 0's row is empty" in check_table(stub["one_f_one_b"])[1]


def test_1f1b_passes_on_real_ranks_beside_the_reference(passed):
    assert passed.passed and passed.stage == "passed", str(passed)
    rows = {r.what: r for r in passed.rows}
    held = rows["activations rank 0 holds at once, microbatches"]
    assert held.measured and held.yours == 4, "1F1B's rank 0 holds p = 4 microbatches, measured"
    bubble = rows["bubble at equal stage costs (simulated, T_B = 2·T_F)"]
    assert bubble.yours == pytest.approx(3 / 11)
    assert rows["loss vs one process, largest relative difference"].yours <= 1e-5
    assert passed.learner is not None and passed.reference is not None
    assert passed.figure() is not None, "the learner's timeline beside the reference's"


def test_gpipe_trains_right_but_holds_m_microbatches_measured(passed, out):
    result = wb.exercises.check("pipeline", GPIPE, out=out)
    assert not result.passed and result.stage == "target", str(result)
    assert "trains the same model as one process" in result.message
    assert "rank 0 held 8.0 microbatches' activations at once" in result.message
    assert "at most p = 4" in result.message
    assert "runs 8 forwards before its first backward" in result.message
    rows = {r.what: r for r in result.rows}
    assert rows["bubble at equal stage costs (simulated, T_B = 2·T_F)"].ok, (
        "GPipe's bubble is 1F1B's"
    )


def test_a_table_that_never_fills_the_pipeline_fails_the_bubble(passed, out):
    result = wb.exercises.check("pipeline", SERIAL, out=out)
    assert not result.passed and result.stage == "target", str(result)
    assert "idles 0.750 of the step against 1F1B's (p−1)/(m+p−1) = 0.273" in result.message
    assert "rank 0 waits 72 of 96 time units" in result.message


@pytest.mark.parametrize(
    "table, words",
    [
        # the warm-up reversed: rank 0 runs none, rank 3 three
        (
            [reference_table(4, 8)[3 - r] for r in range(4)],
            "rank 0's B0 waits for B0's gradient from rank 1, which is waiting at F1 for F1's activation "
            "from rank 0 — and rank 0 runs F1 only after its B0",
        ),
        # rank 1 runs its backwards early: B2 before F3
        (
            [
                row
                if r != 1
                else ["F0", "F1", "F2", "B0", "B1", "B2", "F3", "B3"]
                + ["F4", "B4", "F5", "B5", "F6", "B6", "F7", "B7"]
                for r, row in enumerate(ONE_F_ONE_B)
            ],
            "rank 1's B2 waits for B2's gradient from rank 2, which is waiting at F3 for F3's activation "
            "from rank 1",
        ),
    ],
    ids=["warm-up-reversed", "backward-too-early"],
)
def test_a_deadlocking_order_is_named_before_any_process_starts(tmp_path, table, words):
    out = str(tmp_path / "deadlock")
    result = wb.exercises.check("pipeline", table, out=out)
    assert not result.passed and result.stage == "validate"
    assert "before any process started: your table deadlocks: " + words in result.message
    assert (
        "p − r forwards before its first backward (here 4, 3, 2, 1: p − r − 1 to fill"
        in result.message
    )
    assert not os.path.exists(out), "nothing launched"


def _changed(rank: int, edit) -> list[list[str]]:
    table = copy.deepcopy(ONE_F_ONE_B)
    edit(table[rank])
    return table


@pytest.mark.parametrize(
    "table, words",
    [
        (_changed(3, lambda row: row.remove("B7")), "rank 3 never runs B7"),
        (
            _changed(1, lambda row: row.__setitem__(row.index("F5"), "F2")),
            "rank 1 runs F2 twice; rank 1 never runs F5",
        ),
        (
            _changed(2, lambda row: (row.remove("B3"), row.insert(row.index("F3"), "B3"))),
            "rank 2 runs B3 before F3: a backward needs the activations its forward saved",
        ),
    ],
    ids=["missing", "repeated", "backward-first"],
)
def test_a_missing_or_repeated_microbatch_is_named_before_any_process_starts(
    tmp_path, table, words
):
    result = wb.exercises.check("pipeline", table, out=str(tmp_path / "x"))
    assert not result.passed and result.stage == "validate"
    assert words in result.message


@pytest.mark.parametrize(
    "table, words",
    [
        ("F0 F1", "must be a list of p lists"),
        ([["F0", "B0"]], "your table has 1 row: one per pipeline rank, 2 to 4"),
        (
            _changed(2, lambda row: row.__setitem__(3, "2F2")),
            "rank 2, cell 3: '2F2' is not an action (the row is the rank: write 'F2')",
        ),
        (_changed(0, lambda row: row.__setitem__(5, "W1")), "zero bubble's I and W are not taken"),
        (_changed(0, lambda row: row.__setitem__(0, 0)), "rank 0, cell 0: 0 is not an action"),
        ([["F16", "B16"]] * 2, "up to 16 microbatches"),
    ],
)
def test_a_bad_cell_is_named_with_what_is_valid(table, words):
    schedule, message = check_table(table)
    assert schedule is None and words in message
    if "cell" in words:
        assert "valid: 'F' or 'B' and a microbatch number" in message


def test_any_p_and_m_are_accepted_as_data():
    for p, m in [(2, 4), (3, 5), (4, 3)]:
        schedule, message = check_table(reference_table(p, m))
        assert schedule is not None and (schedule.p, schedule.m) == (p, m), message


def test_a_run_that_differs_from_one_process_is_caught(passed, out):
    """The one-process check can fail: the learner's run against a one-process run whose losses are 1e-4
    (relative) off — what a microbatch dropped from the gradient does within a step or two."""
    schedule, _ = check_table(ONE_F_ONE_B)
    single = wb.load(os.path.join(out, "one_process"))
    metrics = single.metrics.copy()
    metrics["loss"] = metrics["loss"] * (1 + 1e-4)
    runs = {
        "yours": passed.learner,
        "reference": passed.reference,
        "one process": types.SimpleNamespace(metrics=metrics),
    }
    result = judge(runs, schedule)
    assert not result.passed and result.stage == "one process"
    assert "differs from one process (loss by 0.0001" in result.message


@pytest.mark.parametrize(
    ("table", "shape"),
    [
        (
            [[f"F{i}" for i in range(4)] + [f"B{i}" for i in range(4)] for _ in range(4)],
            "4 rows and 4",
        ),
        ([["F0", "B0"], ["F0", "B0"]], "2 rows and 1"),
        (reference_table(4, 7), "4 rows and 7"),
    ],
    ids=["gpipe-at-m-4", "two-ranks-one-microbatch", "1f1b-at-m-7"],
)
def test_the_exercise_wants_p_4_and_m_8_before_any_process_starts(tmp_path, table, shape):
    """At m ≤ p GPipe holds what 1F1B holds and its bubble is 1F1B's: the exercise asks for the shape that
    tells them apart, and points a schedule of another shape to try_schedule."""
    result = wb.exercises.check("pipeline", table, out=str(tmp_path))
    assert not result.passed and result.stage == "validate", str(result)
    assert f"your table has {shape} microbatches" in result.message
    assert "wb.exercises.try_schedule(table)" in result.message
    assert not os.listdir(tmp_path), "nothing launched"


#: rank 1 runs rank 0's order: four forwards before its first backward, one more than 1F1B's rank 1
RANK_1_HOLDS_ONE_MORE = [ONE_F_ONE_B[0], ONE_F_ONE_B[0], ONE_F_ONE_B[2], ONE_F_ONE_B[3]]


def test_a_rank_other_than_0_holding_more_than_1f1b_fails_the_target(passed, out):
    result = wb.exercises.check("pipeline", RANK_1_HOLDS_ONE_MORE, out=out)
    assert not result.passed and result.stage == "target", str(result)
    assert "rank 1 has 4 microbatches in flight at once (counted from your table)" in result.message
    assert "p − r = 3" in result.message


def test_try_schedule_trains_any_valid_table_and_shows_it_beside_1f1b(passed, out):
    result = wb.exercises.try_schedule(GPIPE, out=out)
    assert result.passed, str(result)
    assert (
        "Beside 1F1B at p = 4, m = 8: activations in flight [8, 8, 8, 8] against [4, 3, 2, 1]"
        in (result.message)
    )
    rows = {r.what: r for r in result.rows}
    assert rows["activations rank 0 holds at once, microbatches"].ok is None, "shown, not held"
