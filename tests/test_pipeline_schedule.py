"""Schedules are data: generated, validated, simulated — no process started here."""

import pytest

from workbench.predict.formulas import bubble_fraction
from workbench.schedules.build import (
    Action,
    ScheduleError,
    build_schedule,
    peak_in_flight,
    simulate,
    validate,
)

#: every schedule the engine can generate, up to p = 8 stages, m = 16 microbatches and v = 4 chunks per rank
EVERY = [
    (name, p, m, v)
    for name in ("gpipe", "1f1b", "interleaved")
    for p in range(1, 9)
    for m in range(1, 17)
    for v in (range(2, 5) if name == "interleaved" else (1,))
    if name != "interleaved" or (p > 1 and m % p == 0)
]

CASES = [
    ("gpipe", 2, 4, 1),
    ("1f1b", 2, 4, 1),
    ("1f1b", 4, 8, 1),
    ("1f1b", 4, 2, 1),
    ("gpipe", 4, 3, 1),
    ("interleaved", 2, 4, 2),
    ("interleaved", 4, 8, 2),
    ("interleaved", 2, 8, 3),
]


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_generated_schedules_are_valid(name, p, m, v):
    assert validate(build_schedule(name, p, m, v)) == []


def test_every_generated_schedule_is_safe_under_nccls_rule():
    """No deadlock when a send may block until its receive is posted (and batches run in order on a rank's
    stream), and the transfers between any two ranks are posted in the same order on both (NCCL has no
    tags): for all 334 schedules with p ≤ 8, m ≤ 16, v ≤ 4."""
    assert len(EVERY) == 334
    failures = {case: errors for case in EVERY if (errors := validate(build_schedule(*case)))}
    assert failures == {}


@pytest.mark.parametrize("name, p, m", [("1f1b", 2, 4), ("1f1b", 4, 8), ("1f1b", 8, 16)])
def test_posting_each_transfer_alone_deadlocks_under_nccl_but_not_gloo(name, p, m):
    """What the executor used to do — each receive just before its action, each send just after, posted
    one at a time — is fine on gloo (a send never blocks) and deadlocks on NCCL: rank r's "send F" and
    rank r+1's "send B" each wait for a receive queued behind the other."""
    old = build_schedule(name, p, m, placement="adjacent")
    assert validate(old, rule="gloo", batched=False) == []
    errors = validate(old, batched=False)
    assert len(errors) == 1 and "deadlock under nccl's rule" in errors[0]
    assert validate(build_schedule(name, p, m)) == [], (
        "the same schedule, batched in lockstep, is safe"
    )


def test_interleaving_needs_the_lockstep_batches():
    """Batching the adjacent transfers is enough for 1F1B but not for interleaving, where a rank's chunks
    talk to both neighbours: only transfers placed in lockstep rounds pass."""
    assert validate(build_schedule("1f1b", 4, 8, placement="adjacent")) == []
    assert any(
        "deadlock" in e
        for e in validate(build_schedule("interleaved", 4, 8, 2, placement="adjacent"))
    )
    assert validate(build_schedule("interleaved", 4, 8, 2)) == []


def test_transfers_posted_in_a_different_order_on_the_two_ranks_are_rejected():
    """Without tags, rank 0's first send to rank 1 meets rank 1's first receive from rank 0: swapping two
    sends would hand microbatch 1's activation to microbatch 0's forward."""
    s = build_schedule("gpipe", 2, 2)
    sends = [i for i, a in enumerate(s.actions[0]) if a.kind == "SEND_F"]
    acts = s.actions[0]
    acts[sends[0]], acts[sends[1]] = acts[sends[1]], acts[sends[0]]
    errors = validate(s)
    assert any(
        "rank 0 → rank 1: transfer #0 is activation 0→1 mb1 on the sender but activation 0→1 mb0"
        in e
        for e in errors
    ), errors


@pytest.mark.parametrize("name, p, m, v", CASES)
def test_simulated_bubble_equals_the_formula_for_equal_costs(name, p, m, v):
    timeline = simulate(build_schedule(name, p, m, v), t_f=1.0, t_b=2.0)
    assert timeline.bubble_fraction() == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)


def test_the_formula_holds_under_gloo_and_nccl_bounds_it():
    """With a send that never blocks (gloo) every schedule's bubble is the formula's. Under NCCL's rule a
    rank's batches queue on one stream, so a transfer can wait behind a batch whose peer is still
    computing: 1F1B and GPipe keep the formula, interleaving at p ≥ 6 loses up to 3.4 points of the step
    (backward = 2 × forward; the most at p = 8, m = 16, v = 2: 0.114 for the formula's 0.080) — never
    less than the formula."""
    for case in EVERY:
        s, want = build_schedule(*case), bubble_fraction(*case[1:])
        assert simulate(s, rule="gloo").bubble_fraction() == pytest.approx(want, abs=1e-12), case
        nccl = simulate(s).bubble_fraction()
        if case[0] != "interleaved" or case[1] < 6:
            assert nccl == pytest.approx(want, abs=1e-12), case
        assert want - 1e-12 <= nccl <= want + 0.035, case


def test_in_flight_microbatches_gpipe_m_1f1b_at_most_p():
    assert peak_in_flight(build_schedule("gpipe", 4, 8)) == [8, 8, 8, 8]
    assert peak_in_flight(build_schedule("1f1b", 4, 8)) == [4, 3, 2, 1]


def test_1f1b_has_warm_up_steady_state_and_cool_down():
    s = build_schedule("1f1b", 4, 8)
    assert s.grid().splitlines()[1] == (
        "rank 1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7"
    )


def test_validator_rejects_backward_before_forward():
    s = build_schedule("1f1b", 2, 2)
    acts = s.actions[1]
    i, j = (
        next(i for i, a in enumerate(acts) if a.kind == "F"),
        next(i for i, a in enumerate(acts) if a.kind == "B"),
    )
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
    """Rank 0 posts the receive of a gradient before the send of the activation rank 1 needs to produce
    it: on NCCL the send queues behind the receive on rank 0's stream, and neither ever runs."""
    s = build_schedule("1f1b", 2, 1)
    s.actions[0] = [
        Action(kind="RECV_B", stage=0, microbatch=0, peer=1),
        Action(kind="F", stage=0, microbatch=0),
        Action(kind="SEND_F", stage=0, microbatch=0, peer=1),
        Action(kind="B", stage=0, microbatch=0),
    ]
    errors = validate(s)
    assert any("deadlock" in e for e in errors)
    with pytest.raises(ScheduleError):
        simulate(s)


def test_a_stage_on_the_wrong_rank_is_rejected():
    s = build_schedule("1f1b", 2, 2)
    s.actions[0][0] = Action(kind="F", stage=1, microbatch=0)
    assert any("lives on rank 1" in e for e in validate(s))


def test_schedule_round_trips_through_json():
    from workbench.schedules.build import Schedule

    s = build_schedule("interleaved", 2, 4, 2)
    assert Schedule.from_dict(s.to_dict()).actions == s.actions
