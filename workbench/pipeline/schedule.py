"""Pipeline schedules, generated as data (actions.py): each rank gets a list of actions, and the same
list is validated (validation.py), simulated without processes (simulator.py), drawn, written to
schedule.json, and executed (executor.py).

Schedules (p stages, m microbatches):
- GPipe (Huang et al. 2019): all m forwards, then all m backwards. Holds m microbatches' activations.
- 1F1B (PipeDream-Flush, Narayanan et al. 2019/2021): warm-up of p − s − 1 forwards on stage s, then
  one forward / one backward alternately (steady state), then the remaining backwards (cool-down).
  Holds at most p − s microbatches.
- Interleaved 1F1B (Narayanan et al. 2021, §2.2): v chunks per rank, microbatches in groups of p;
  warm-up of 2(p − r − 1) + (v − 1)·p forward chunks on rank r. Bubble shrinks by v.

Each forward is preceded by the receive of its input and followed by the send of its output (the reverse
for backward); the executor posts the transfers between two compute actions as one batch, which
`validate` proves free of deadlock under NCCL's rule (a send may wait for its receive).
"""

from __future__ import annotations

from workbench.pipeline.actions import COMPUTE, KINDS, Action, P2PBatch, Schedule, peak_in_flight
from workbench.pipeline.simulator import ScheduleError, Timeline, simulate
from workbench.pipeline.validation import validate

__all__ = ["COMPUTE", "KINDS", "Action", "P2PBatch", "Schedule", "ScheduleError", "Timeline", "build_schedule",
           "peak_in_flight", "simulate", "validate"]


# ---- generators -------------------------------------------------------------------------------
def _compute_order(name: str, p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """(kind, stage, microbatch) of the compute actions of one rank, in order."""
    if name == "gpipe":
        return [("F", rank, i) for i in range(m)] + [("B", rank, i) for i in range(m)]
    if name == "1f1b":
        warmup = min(p - rank - 1, m)
        order = [("F", rank, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:  # steady state: one forward, one backward
            order += [("F", rank, f), ("B", rank, b)]
            f, b = f + 1, b + 1
        order += [("B", rank, i) for i in range(b, m)]  # cool-down
        return order
    if name == "interleaved":
        total = m * v

        def fwd(k: int) -> tuple[str, int, int]:
            chunk = (k // p) % v
            return ("F", chunk * p + rank, (k // (p * v)) * p + k % p)

        def bwd(k: int) -> tuple[str, int, int]:
            chunk = v - 1 - (k // p) % v
            return ("B", chunk * p + rank, (k // (p * v)) * p + k % p)

        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
        order = [fwd(k) for k in range(warmup)]
        f, b = warmup, 0
        while f < total:
            order += [fwd(f), bwd(b)]
            f, b = f + 1, b + 1
        order += [bwd(k) for k in range(b, total)]
        return order
    raise ValueError(f"unknown schedule {name!r}; valid: gpipe, 1f1b, interleaved")


def build_schedule(name: str, p: int, m: int, v: int = 1, placement: str = "lockstep") -> Schedule:
    """Every rank's actions: its compute actions in the schedule's order, and its transfers placed by
    `placement`: "lockstep" (what runs: `_lockstep`), or "adjacent" — each receive right before the
    action that needs it, each send right after the one that made it, as the executor once posted them,
    one at a time (kept to show why that deadlocks on NCCL: tests/test_pipeline_schedule.py)."""
    if name != "interleaved" and v != 1:
        raise ValueError(f"schedule {name!r} runs one stage per rank: virtual_stages must be 1, got {v}")
    if name == "interleaved" and (m % p or p < 2):
        raise ValueError(f"interleaved 1F1B needs pp ≥ 2 and microbatches divisible by pp: m={m}, p={p}")
    if placement not in ("lockstep", "adjacent"):
        raise ValueError(f"placement={placement!r}: valid are 'lockstep', 'adjacent'")
    sched = Schedule(name, p, m, v)
    orders = [_compute_order(name, p, m, v, r) for r in range(p)]
    sched.actions = _lockstep(sched, orders) if placement == "lockstep" else _adjacent(sched, orders)
    return sched


def _adjacent(s: Schedule, orders: list[list[tuple[str, int, int]]]) -> list[list[Action]]:
    last = s.stages - 1
    actions: list[list[Action]] = []
    for order in orders:
        acts: list[Action] = []
        for kind, stage, mb in order:
            if (need := _transfer_in(kind, stage, mb, last)) is not None:
                acts.append(Action(f"RECV_{kind}", stage, mb, need[1]))
            acts.append(Action(kind, stage, mb))
            out = stage + 1 if kind == "F" else stage - 1
            if 0 <= out <= last:
                acts.append(Action(f"SEND_{kind}", stage, mb, out))
        actions.append(acts)
    return actions


def _transfer_in(kind: str, stage: int, mb: int, last: int) -> tuple[str, int, int, int] | None:
    """What a compute action needs from another stage: the activation into a forward, the gradient into
    a backward — (F or B, from stage, to stage, microbatch), or None at the pipeline's ends."""
    if kind == "F":
        return ("F", stage - 1, stage, mb) if stage > 0 else None
    return ("B", stage + 1, stage, mb) if stage < last else None


def _lockstep(s: Schedule, orders: list[list[tuple[str, int, int]]]) -> list[list[Action]]:
    """Place the transfers in lockstep (Megatron-LM's batched p2p): in round t every rank runs its next
    compute action if its input has arrived, then posts one batch — the sends of what it just computed,
    and the receives of what its neighbours just computed for it. Batch t on one rank therefore meets
    batch t on each of its neighbours, send for receive, so no batch waits on a later one (NCCL's rule),
    and both ranks of a pair list their common transfers in the same (sorted) order: no tags needed. A
    rank with nothing to run in a round merges that round's transfers into its next batch."""
    last = s.stages - 1
    pos = [0] * s.p
    arrived: set[tuple[str, int, int, int]] = set()
    actions: list[list[Action]] = [[] for _ in range(s.p)]
    rounds = 0
    while any(pos[r] < len(orders[r]) for r in range(s.p)):
        sent: list[tuple[str, int, int, int]] = []
        before = list(pos)
        for r in range(s.p):
            if pos[r] == len(orders[r]):
                continue
            kind, stage, mb = orders[r][pos[r]]
            need = _transfer_in(kind, stage, mb, last)
            if need is not None and need not in arrived:
                continue  # idle this round: its input is still on the way
            pos[r] += 1
            actions[r].append(Action(kind, stage, mb))
            out = ("F", stage, stage + 1, mb) if kind == "F" else ("B", stage, stage - 1, mb)
            if 0 <= out[2] <= last:
                sent.append(out)
        if not sent and pos == before:
            raise ValueError(f"schedule {s.name!r}: no rank can run its next action in round {rounds}")
        for t in sorted(sent):
            kind, src, dst, mb = t
            actions[s.rank_of(src)].append(Action(f"SEND_{kind}", src, mb, dst, rounds))
            actions[s.rank_of(dst)].append(Action(f"RECV_{kind}", dst, mb, src, rounds))
        arrived.update(sent)
        rounds += 1
    return actions
