"""Is a schedule safe to run? `validate(schedule)` lists its problems (empty = valid):

- every (stage, microbatch) forwarded once and backwarded once — as B, or split as I then W (Qi et al.:
  count(I) = count(W), W only after its I) — on the rank its stage lives on, forward first; every
  stage on exactly one rank;
- two stages on one rank (a V's turn) hand over in order: a stage's forward after the forward that
  feeds it, its backward after the backward that feeds it;
- an F&B pair (`Action.pair`) is an F followed at once by a B of another microbatch, on one rank;
- every send matched by exactly one receive, and the reverse;
- **order between two ranks**: NCCL ignores tags, so the transfers from rank A to rank B are matched
  in the order they are posted — A's sends to B must come in the order B posts its receives from A, or
  a receive gets another transfer's tensor (of the same shape: silently wrong). The executor posts no
  tags on either backend, so gloo matches the same way;
- **no deadlock under NCCL's rule** (simulator.py): with the rank's transfers posted in batches, a
  send may block until its receive is posted. Passing this implies passing gloo's rule too.
"""

from __future__ import annotations

from collections import defaultdict

from workbench.schedules.actions import BACKWARD, COMPUTE, KINDS, Action, Schedule, Transfer
from workbench.schedules.simulator import ScheduleError, simulate


def validate(s: Schedule, rule: str = "nccl", batched: bool = True) -> list[str]:
    """Problems with a schedule (empty = valid): coverage, placement and order of compute, matched
    transfers, the same order of transfers on both ranks of a pair, and no deadlock under `rule`."""
    if len(s.actions) != s.p:
        return [f"{len(s.actions)} action lists for {s.p} ranks"]
    errors = coverage(s)
    sends: defaultdict[Transfer, int] = defaultdict(int)
    recvs: defaultdict[Transfer, int] = defaultdict(int)
    for acts in s.actions:
        for a in acts:
            if a.is_send:
                sends[a.transfer()] += 1
            elif a.is_recv:
                recvs[a.transfer()] += 1
    for t in sorted(set(sends) | set(recvs)):
        if sends[t] != 1 or recvs[t] != 1:
            errors.append(
                f"transfer {_name(t)} is sent {sends[t]} time(s) and received {recvs[t]} time(s) "
                f"(want once each)"
                + (": never received" if sends[t] and not recvs[t] else "")
                + (
                    ": a receive waits for a send that never comes"
                    if recvs[t] and not sends[t]
                    else ""
                )
            )
    if not errors:
        errors += pair_order(s)
    if not errors:
        try:
            simulate(s, rule=rule, batched=batched)
        except ScheduleError as e:
            errors.append(str(e))
    return errors


def coverage(s: Schedule) -> list[str]:
    """The compute actions' problems: each pass once, on its stage's rank, after what it depends on there."""
    errors: list[str] = []
    seen: dict[tuple[str, int, int], int] = defaultdict(int)
    ranks_of: dict[int, set[int]] = defaultdict(set)
    for rank, acts in enumerate(s.actions):
        done: set[tuple[str, int, int]] = set()
        for a in acts:
            if a.kind not in KINDS:
                errors.append(f"rank {rank}: unknown action kind {a.kind!r}")
                continue
            ranks_of[a.stage].add(rank)
            if s.rank_of(a.stage) != rank:
                errors.append(
                    f"rank {rank}: {a} belongs to stage {a.stage}, which lives on rank {s.rank_of(a.stage)}"
                )
            if a.kind in COMPUTE:
                seen[(a.kind, a.stage, a.microbatch)] += 1
                errors += _order_on_rank(s, rank, a, done)
                done.add((a.kind, a.stage, a.microbatch))
    errors += [
        f"stage {st} has actions on ranks {sorted(r)} (want exactly one)"
        for st, r in sorted(ranks_of.items())
        if len(r) > 1
    ]
    errors += _fb_pairs(s)
    for stage in range(s.stages):
        for mb in range(s.m):
            n = {k: seen.get((k, stage, mb), 0) for k in COMPUTE}
            if not s.carries(stage, mb):
                if any(n.values()):
                    errors.append(
                        f"stage {stage} runs microbatch {mb}, which takes DualPipe's other pipeline"
                    )
                continue
            if n["F"] != 1:
                errors.append(f"{stage}F{mb} appears {n['F']} times (want 1)")
            if n["I"] != n["W"]:
                errors.append(
                    f"{stage}I{mb} appears {n['I']} times and {stage}W{mb} {n['W']} (count(I) = count(W))"
                )
            if (n["B"], n["I"]) not in ((1, 0), (0, 1)):
                errors.append(
                    f"{stage}{mb}: backward as B {n['B']} times and as I {n['I']} times "
                    f"(want once, either B or I then W)"
                )
    return errors


def _order_on_rank(s: Schedule, rank: int, a: Action, done: set[tuple[str, int, int]]) -> list[str]:
    """Dependencies a compute action has on what ran before it on its rank."""
    st, mb = a.stage, a.microbatch
    if a.kind in BACKWARD and ("F", st, mb) not in done:
        return [f"rank {rank}: {a} runs before its forward"]
    if a.kind == "W" and ("I", st, mb) not in done:
        return [
            f"rank {rank}: {a} runs before its I (a weight gradient needs the output's gradient)"
        ]
    feed = s.prev_stage(st) if a.kind == "F" else s.next_stage(st)
    if (
        a.kind != "W"
        and feed is not None
        and s.local(feed, st)
        and not any((k, feed, mb) in done for k in ((a.kind,) if a.kind == "F" else BACKWARD))
    ):
        return [
            f"rank {rank}: {a} runs before stage {feed}'s {'forward' if a.kind == 'F' else 'backward'} "
            f"of microbatch {mb}, on the same rank, hands it its {'input' if a.kind == 'F' else 'gradient'}"
        ]
    return []


def _fb_pairs(s: Schedule) -> list[str]:
    """Each F&B pair: an F and, next among the rank's compute actions, a B of another microbatch."""
    errors = []
    for rank, acts in enumerate(s.actions):
        compute = [a for a in acts if a.kind in COMPUTE]
        numbers = [a.pair for a in compute if a.pair is not None]
        for n in sorted(set(numbers)):
            i = next(k for k, a in enumerate(compute) if a.pair == n)
            pair = compute[i : i + 2]
            if numbers.count(n) != 2 or [a.kind for a in pair] != ["F", "B"] or pair[1].pair != n:
                errors.append(
                    f"rank {rank}: F&B pair {n} is {' '.join(str(a) for a in pair)} "
                    f"(want an F followed at once by a B, both numbered {n})"
                )
            elif pair[0].microbatch == pair[1].microbatch and pair[0].stage == pair[1].stage:
                errors.append(f"rank {rank}: F&B pair {n} pairs {pair[0]} with its own backward")
    return errors


def pair_order(s: Schedule) -> list[str]:
    """Transfers between two ranks posted in different orders by the sender and the receiver (NCCL,
    without tags, would match them by position)."""
    sent: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    received: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    for rank, acts in enumerate(s.actions):
        for a in acts:
            if a.is_send:
                sent[(rank, s.rank_of(a.peer_stage))].append(a.transfer())
            elif a.is_recv:
                received[(s.rank_of(a.peer_stage), rank)].append(a.transfer())
    errors = []
    for (src, dst), order in sorted(sent.items()):
        theirs = received.get((src, dst), [])
        for i, (x, y) in enumerate(zip(order, theirs, strict=False)):
            if x != y:
                errors.append(
                    f"rank {src} → rank {dst}: transfer #{i} is {_name(x)} on the sender but {_name(y)} "
                    f"on the receiver (without tags they are matched by position)"
                )
                break
    return errors


def _name(t: Transfer) -> str:
    kind, src, dst, mb = t
    return f"{'activation' if kind == 'F' else 'gradient'} {src}→{dst} mb{mb}"
