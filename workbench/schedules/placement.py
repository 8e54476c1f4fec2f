"""Where a schedule's transfers go: given each rank's compute order, every activation and gradient that
crosses ranks gets its send (after the action that made it) and its receive (before the action that
needs it). `_lockstep` is what runs (Megatron-LM's batched p2p, proven deadlock-free under NCCL's rule
by validation.py); `_adjacent` is the one-at-a-time posting kept to show why that deadlocks.

Two stages on one rank (a V's turn) get no transfer: the executor hands the tensor over in memory. An
F&B pair (actions.py) is one step: both its inputs are received before it, both its outputs sent after.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.schedules.actions import Action, Compute, Schedule, Step, Transfer, flatten


def schedule_from_orders(
    name: str,
    p: int,
    m: int,
    v: int,
    orders: Sequence[Sequence[Step]],
    *,
    stage_placement: str = "loop",
    placement: str = "lockstep",
) -> Schedule:
    """A schedule from each rank's compute order (kind, stage, microbatch, or an F&B pair of two), its
    transfers placed."""
    if placement not in ("lockstep", "adjacent"):
        raise ValueError(f"placement={placement!r}: valid are 'lockstep', 'adjacent'")
    sched = Schedule(name=name, p=p, m=m, v=v, placement=stage_placement)
    sched.actions = (
        _lockstep(sched, orders) if placement == "lockstep" else _adjacent(sched, orders)
    )
    return sched


def _adjacent(s: Schedule, orders: Sequence[Sequence[Step]]) -> list[list[Action]]:
    actions: list[list[Action]] = []
    for order in orders:
        acts: list[Action] = []
        for kind, stage, mb in flatten(order):
            if (need := _transfer_in(s, kind, stage, mb)) is not None:
                acts.append(
                    Action(kind=f"RECV_{need[0]}", stage=stage, microbatch=mb, peer=need[1])
                )
            acts.append(Action(kind=kind, stage=stage, microbatch=mb))
            if (out := _transfer_out(s, kind, stage, mb)) is not None:
                acts.append(Action(kind=f"SEND_{out[0]}", stage=stage, microbatch=mb, peer=out[2]))
        actions.append(acts)
    return actions


def _transfer_in(s: Schedule, kind: str, stage: int, mb: int) -> Transfer | None:
    """What a compute action needs from another rank: the activation into a forward, the gradient into
    a backward (B or I) — (F or B, from stage, to stage, microbatch); None at the pipeline's ends, for W,
    and from a stage on the same rank (handed over in memory)."""
    src = s.prev_stage(stage) if kind == "F" else s.next_stage(stage)
    if kind == "W" or src is None or s.local(src, stage):
        return None
    return ("F" if kind == "F" else "B", src, stage, mb)


def _transfer_out(s: Schedule, kind: str, stage: int, mb: int) -> Transfer | None:
    """What a compute action sends to another rank (the mirror of `_transfer_in`)."""
    dst = s.next_stage(stage) if kind == "F" else s.prev_stage(stage)
    if kind == "W" or dst is None or s.local(stage, dst):
        return None
    return ("F" if kind == "F" else "B", stage, dst, mb)


def _lockstep(s: Schedule, orders: Sequence[Sequence[Step]]) -> list[list[Action]]:
    """Place the transfers in lockstep (Megatron-LM's batched p2p): in round t every rank runs its next
    compute step (an action, or an F&B pair) if its inputs have arrived, then posts one batch — the sends
    of what it just computed, and the receives of what its neighbours just computed for it. Batch t on one
    rank therefore meets batch t on each of its neighbours, send for receive, so no batch waits on a later
    one (NCCL's rule), and both ranks of a pair list their common transfers in the same (sorted) order: no
    tags needed. A rank with nothing to run in a round merges that round's transfers into its next batch."""
    pos = [0] * s.p
    arrived: set[Transfer] = set()
    actions: list[list[Action]] = [[] for _ in range(s.p)]
    pairs = [0] * s.p  # the next F&B pair's number, per rank
    rounds = 0
    while any(pos[r] < len(orders[r]) for r in range(s.p)):
        sent: list[Transfer] = []
        before = list(pos)
        for r in range(s.p):
            if pos[r] == len(orders[r]):
                continue
            step = orders[r][pos[r]]
            parts: list[Compute] = list(step) if isinstance(step[0], tuple) else [step]
            needs = [_transfer_in(s, *c) for c in parts]
            if any(n is not None and n not in arrived for n in needs):
                continue  # idle this round: an input is still on the way
            pos[r] += 1
            pair = None
            if len(parts) == 2:
                pair, pairs[r] = pairs[r], pairs[r] + 1
            for kind, stage, mb in parts:
                actions[r].append(Action(kind=kind, stage=stage, microbatch=mb, pair=pair))
                if (out := _transfer_out(s, kind, stage, mb)) is not None:
                    sent.append(out)
        if not sent and pos == before:
            raise ValueError(
                f"schedule {s.name!r}: no rank can run its next action in round {rounds}"
            )
        for t in sorted(sent):
            kind, src, dst, mb = t
            actions[s.rank_of(src)].append(
                Action(kind=f"SEND_{kind}", stage=src, microbatch=mb, peer=dst, batch=rounds)
            )
            actions[s.rank_of(dst)].append(
                Action(kind=f"RECV_{kind}", stage=dst, microbatch=mb, peer=src, batch=rounds)
            )
        arrived.update(sent)
        rounds += 1
    return actions
