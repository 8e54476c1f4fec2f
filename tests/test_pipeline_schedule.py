"""Schedules are data: generated, validated, simulated — no process started here."""

import pytest

from workbench.formulas import bubble_fraction
from workbench.pipeline.schedule import Action, ScheduleError, build_schedule, peak_in_flight, simulate, validate

CASES = [("gpipe", 2, 4, 1), ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("gpipe", 4, 3, 1),
         ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2), ("interleaved", 2, 8, 3)]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_generated_schedules_are_valid(name, p, m, v):
    assert validate(build_schedule(name, p, m, v)) == []


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_simulated_bubble_equals_the_formula_for_equal_costs(name, p, m, v):
    timeline = simulate(build_schedule(name, p, m, v), t_f=1.0, t_b=2.0)
    assert timeline.bubble_fraction() == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)


def test_in_flight_microbatches_gpipe_m_1f1b_at_most_p():
    assert peak_in_flight(build_schedule("gpipe", 4, 8)) == [8, 8, 8, 8]
    assert peak_in_flight(build_schedule("1f1b", 4, 8)) == [4, 3, 2, 1]


def test_1f1b_has_warm_up_steady_state_and_cool_down():
    s = build_schedule("1f1b", 4, 8)
    assert s.grid().splitlines()[1] == ("rank 1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 "
                                        "1B6 1B7")


def test_validator_rejects_backward_before_forward():
    s = build_schedule("1f1b", 2, 2)
    acts = s.actions[1]
    i, j = next(i for i, a in enumerate(acts) if a.kind == "F"), next(i for i, a in enumerate(acts) if a.kind == "B")
    acts[i], acts[j] = acts[j], acts[i]
    assert any("before its forward" in e for e in validate(s))


def test_validator_rejects_an_unmatched_send_and_a_missing_microbatch():
    s = build_schedule("gpipe", 2, 2)
    s.actions[1] = [a for a in s.actions[1] if not (a.kind == "RECV_F" and a.microbatch == 1)]
    errors = validate(s)
    assert any("never received" in e for e in errors)
    s = build_schedule("gpipe", 2, 2)
    s.actions[0] = [a for a in s.actions[0] if a.microbatch != 1 or a.kind not in ("F", "SEND_F")]
    assert any("0F1 appears 0 times" in e for e in validate(s))


def test_validator_finds_a_deadlock():
    """Rank 0 waits for a gradient before sending the activation rank 1 needs to produce it."""
    s = build_schedule("1f1b", 2, 1)
    s.actions[0] = [Action("RECV_B", 0, 0, 1), Action("F", 0, 0), Action("SEND_F", 0, 0, 1), Action("B", 0, 0)]
    errors = validate(s)
    assert any("deadlock" in e for e in errors)
    with pytest.raises(ScheduleError):
        simulate(s)


def test_a_stage_on_the_wrong_rank_is_rejected():
    s = build_schedule("1f1b", 2, 2)
    s.actions[0][0] = Action("F", 1, 0)
    assert any("lives on rank 1" in e for e in validate(s))


def test_schedule_round_trips_through_json():
    from workbench.pipeline.schedule import Schedule

    s = build_schedule("interleaved", 2, 4, 2)
    assert Schedule.from_dict(s.to_dict()).actions == s.actions
