"""The checkpoint-interval exercise: Young/Daly's interval passes at the cost a real run measures; the typical wrong
answers are named, before any process starts where the modelled settings show them, at the measured cost where
only it does."""

from __future__ import annotations

import ast
import math
import os

import pytest

import workbench as wb
from workbench.exercises import answers
from workbench.exercises import checkpoint_interval as ci
from workbench.exercises.submission import function_source
from workbench.predict.formulas.faults import checkpoint_overhead, young_daly_interval


def forgot_the_nodes(checkpoint_s, failures_per_node_day, nodes):
    return math.sqrt(2 * checkpoint_s * 86_400 / failures_per_node_day)


def missing_the_2(checkpoint_s, failures_per_node_day, nodes):
    return math.sqrt(checkpoint_s * 86_400 / (failures_per_node_day * nodes))


def mtbf_in_hours(checkpoint_s, failures_per_node_day, nodes):
    return math.sqrt(2 * checkpoint_s * 24 / (failures_per_node_day * nodes))


def no_square_root(checkpoint_s, failures_per_node_day, nodes):
    return 2 * checkpoint_s * 86_400 / (failures_per_node_day * nodes)


def rounded_to_minutes(checkpoint_s, failures_per_node_day, nodes):
    tau = math.sqrt(2 * checkpoint_s * 86_400 / (failures_per_node_day * nodes))
    return 60 * max(1, round(tau / 60))


def dalys(checkpoint_s, failures_per_node_day, nodes):
    return math.sqrt(2 * checkpoint_s * 86_400 / (failures_per_node_day * nodes)) - checkpoint_s


def divides_by_zero(checkpoint_s, failures_per_node_day, nodes):
    mtbf_s = 86_400 / (failures_per_node_day * nodes)
    return math.sqrt(2 * checkpoint_s * mtbf_s) / (nodes - nodes)


def check(fn, tmp_path):
    return wb.exercises.check("checkpoint-interval", fn, out=str(tmp_path))


def test_the_reference_answer_passes_at_the_checkpoint_cost_a_real_run_measures(tmp_path):
    result = check(answers.checkpoint_interval, tmp_path)
    assert result.passed, str(result)
    cost = result.rows[0]
    assert cost.measured and 0 < cost.yours < 5_000  # ms: a tiny model's save, by the clock
    ev = result.reference.events
    saves = ev[(ev.cat == "checkpoint") & ev.name.str.startswith("checkpoint save")]
    assert sorted(saves.step.unique()) == list(range(1, ci.MEASURED_STEPS + 1))
    assert saves.groupby("step")["dur_us"].max().iloc[1:].median() / 1e3 == pytest.approx(
        cost.yours
    )
    held = [r for r in result.rows if r.ok is not None]
    assert len(held) == len(ci.AT_MEASURED) and all(r.ok for r in held)
    assert result.chart is not None and result.figure() is result.chart


def test_forgetting_the_nodes_is_named_before_any_process_starts(tmp_path):
    result = check(forgot_the_nodes, tmp_path)
    assert not result.passed and result.stage == "validate"
    assert "before any process started" in result.message
    assert "1024 nodes" in result.message and "√1024 = 32 times too long" in result.message
    assert "the job stops when any of its 1024 nodes fails" in result.message.lower()
    assert "divided by 1024" in result.message
    assert not os.path.exists(tmp_path / "measured")  # no run was launched


def test_the_missing_2_is_named_with_the_half_interval_it_forgets(tmp_path):
    result = check(missing_the_2, tmp_path)
    assert not result.passed and result.stage == "validate"
    assert "0.7071 × Young's at every setting: the 2 is missing" in result.message
    assert "half an interval" in result.message and "τ = √(2δM)" in result.message


def test_an_mtbf_in_hours_is_named_as_a_unit(tmp_path):
    result = check(mtbf_in_hours, tmp_path)
    assert not result.passed and result.stage == "validate"
    assert "0.01667 × Young's at every setting: a unit" in result.message
    assert "1 day = 86 400 s" in result.message


def test_no_square_root_is_named(tmp_path):
    result = check(no_square_root, tmp_path)
    assert not result.passed and result.stage == "validate"
    assert "Your interval is 2δM, with no square root" in result.message


def test_an_interval_rounded_to_whole_minutes_fails_only_at_the_measured_cost(tmp_path):
    """A minute is within 1 % of the least at the modelled costs (intervals of 2–100 minutes), not at a checkpoint
    of tens of milliseconds, whose best interval is seconds: the real run's measurement shows it."""
    assert ci.diagnose(_found(rounded_to_minutes, ci.MODELLED)) is None
    result = check(rounded_to_minutes, tmp_path)
    assert not result.passed and result.stage == "target", str(result)
    assert (
        "held at the modelled costs (10–300 s) but not at the cost measured here" in result.message
    )
    assert "(measured)" in result.message and "your interval is 60 s" in result.message
    assert "A cheap checkpoint is best taken often" in result.message
    assert any(r.ok is False for r in result.rows)
    assert result.chart is not None


def test_dalys_interval_passes_too():
    assert ci.diagnose(_found(dalys, ci.MODELLED)) is None


def test_the_least_waste_is_searched_and_lands_on_youngs_interval():
    """The check's reference is a search of the waste, not Young's formula: here they agree."""
    for s in ci.MODELLED:
        best, least = ci.least_waste(s)
        young = young_daly_interval(s.checkpoint_s, s.mtbf_s, daly=False)
        assert abs(best / young - 1) < 1e-6
        assert abs(least / checkpoint_overhead(young, s.checkpoint_s, s.mtbf_s) - 1) < 1e-9


def test_an_exception_or_a_non_number_is_named_with_the_setting(tmp_path):
    raised = check(divides_by_zero, tmp_path)
    assert raised.stage == "validate" and "raised ZeroDivisionError" in raised.message
    assert (
        "line 3 of your function: return math.sqrt(2 * checkpoint_s * mtbf_s) / (nodes - nodes)"
        in (raised.message)
    )

    def returns_nothing(checkpoint_s, failures_per_node_day, nodes):
        pass

    nothing = check(returns_nothing, tmp_path)
    assert nothing.stage == "validate" and "returned None" in nothing.message
    assert "positive number of seconds" in nothing.message
    assert "δ = 30 s, 0.01 failures per node-day, 1024 nodes" in nothing.message

    def two_arguments(checkpoint_s, mtbf_s):
        return math.sqrt(2 * checkpoint_s * mtbf_s)

    wrong = check(two_arguments, tmp_path)
    assert wrong.stage == "validate" and "calls it with 3 arguments" in wrong.message


def test_the_task_and_the_stub():
    ex = wb.exercises.EXERCISES["checkpoint-interval"]
    assert "def checkpoint_interval(checkpoint_s, failures_per_node_day, nodes)" in ex.task
    (stub,) = ast.parse(ex.stub).body
    assert isinstance(stub, ast.FunctionDef) and stub.name == answers.checkpoint_interval.__name__
    assert "checkpoint_interval(checkpoint_s" in answers.source("checkpoint-interval")


def _found(fn, settings):
    found = ci.evaluate(
        function_source(fn, function="checkpoint_interval", params=ci.PARAMS), settings
    )
    assert not isinstance(found, str), found
    return found


def test_a_function_that_does_not_return_is_stopped_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(ci, "CALL_DEADLINE_S", 0.5)

    def checkpoint_interval(checkpoint_s, failures_per_node_day, nodes):
        import time

        time.sleep(3)  # stands in for a loop that does not end (and ends, for the test's sake)
        return 1.0

    result = check(checkpoint_interval, tmp_path)
    assert result.stage == "validate"
    assert result.message.endswith(
        "your function did not return within 0.5 s: a loop that does not end? (it still runs in this "
        "kernel; restart the kernel)"
    )


def test_a_name_error_says_what_globals_the_function_has(tmp_path):
    def checkpoint_interval(checkpoint_s, failures_per_node_day, nodes):
        return young(checkpoint_s, 86_400 / (failures_per_node_day * nodes))  # noqa: F821

    result = check(checkpoint_interval, tmp_path)
    assert result.stage == "validate"
    assert (
        "your function raised NameError: name 'young' is not defined (line 2 of your function: "
        in (result.message)
    )
    assert (
        "your function runs with only torch and math as its globals (on the ranks too): define or import "
        "what it uses inside it" in result.message
    )
