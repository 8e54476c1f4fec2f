"""A schedule replayed without processes: the timeline from per-action costs, and deadlock found.

The executor posts each batch of transfers (actions.P2PBatch) without waiting, and waits only when a
compute action needs what a batch receives (and, at the step's end, for everything). When a posted
transfer may finish depends on the backend (`rule=`):

    "nccl"   (the default) a rank's batches run one after another on its communication stream (one
             NCCL group each), and a batch finishes only once the other side of every transfer in it
             has started on the peer's stream: a send may block until its receive is posted — NCCL above
             its eager threshold (a few MB, `NCCL_BUFFSIZE`; gpt2-small's activations at seq 1024 are
             1.5 MB per sample) — and whatever the rank queued behind a blocked batch waits with it.
    "gloo"   a send never blocks (gloo copies it out); a receive finishes once its send is posted.

A schedule that finishes under "nccl" finishes under "gloo" too (the rule only adds waiting), so the
validator checks the stricter one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workbench.schedules.actions import Action, Item, P2PBatch, Schedule, Transfer

RULES = ("nccl", "gloo")


class ScheduleError(ValueError):
    pass


def idle_rate(per_rank: Sequence[Sequence[tuple[float, float]]]) -> float:
    """The most idle time any rank has between its first and last busy moment, over its busy time (the
    zero-bubble paper's bubble rate), from each rank's busy intervals: simulated or recorded."""
    rates = []
    for iv in per_rank:
        busy = sum(b - a for a, b in iv)
        if iv and busy > 0:
            rates.append((max(b for _, b in iv) - min(a for a, _ in iv) - busy) / busy)
    return max(rates, default=0.0)


@dataclass
class Timeline:
    """Simulated (or measured) compute intervals: per rank, (action, start, end)."""

    spans: list[list[tuple[Action, float, float]]]

    @property
    def makespan(self) -> float:
        return max((e for rank in self.spans for _, _, e in rank), default=0.0)

    def idle_per_rank(self) -> float:
        """The most idle time any rank has over the step (from 0 to the end of the last action): DeepSeek's
        bubble for DualPipe(V), the start-up stagger included."""
        return max(
            (self.makespan - sum(e - b for _, b, e in rank) for rank in self.spans), default=0.0
        )

    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over ranks: 1 − busy / makespan."""
        total = self.makespan
        if total <= 0:
            return 0.0
        busy = [sum(e - b for _, b, e in rank) for rank in self.spans]
        return sum(1 - x / total for x in busy) / len(busy)

    def bubble_rate(self) -> float:
        """The zero-bubble paper's bubble rate (Qi et al. 2024, Table 2): the most idle time any rank has
        between its first and its last pass, over that rank's busy time. 1F1B: (p − 1)/m at T_F = T_B;
        ZB-H1: (p − 1)/3m and ZBV: 0 at T_F = T_I = T_W. The start-up stagger is not counted — it is the
        slanted edge of the "parallelogram" that a step without optimizer synchronisation would overlap
        with the next (and that `bubble_fraction` does count)."""
        return idle_rate([[(b, e) for _, b, e in rank] for rank in self.spans])


@dataclass(kw_only=True)
class _Posted:
    """One batch on a rank's stream: when it was posted, when it started and finished (None: not yet known)."""

    rank: int
    index: int  # position among the rank's batches (its stream order)
    batch: P2PBatch
    posted: float
    started: float | None = None
    done: float | None = None
    done_of: dict[Transfer, float] = field(default_factory=dict)  # gloo: each receive's own finish


class _Streams:
    """The posted batches of every rank and when they finish under a rule."""

    def __init__(
        self, p: int, rule: str, t_comm: float, cost: Callable[[int, Item], tuple[float, float]]
    ) -> None:
        self.rule, self.t_comm, self.cost = rule, t_comm, cost
        self.batches: list[list[_Posted]] = [[] for _ in range(p)]
        self.side: dict[tuple[str, Transfer], _Posted] = {}  # ("send"|"recv", transfer) → its batch

    def post(self, rank: int, batch: P2PBatch, at: float) -> _Posted:
        b = _Posted(rank=rank, index=len(self.batches[rank]), batch=batch, posted=at)
        self.batches[rank].append(b)
        for a in batch.actions:
            self.side[("send" if a.is_send else "recv", a.transfer())] = b
        return b

    def resolve(self) -> None:
        """Give every batch whose finish is now determined its times (a fixpoint over all ranks)."""
        changed = True
        while changed:
            changed = False
            for rank_batches in self.batches:
                for b in rank_batches:
                    if b.done is None and self._finish(b):
                        changed = True

    def _finish(self, b: _Posted) -> bool:
        if self.rule == "gloo":  # no stream: each receive waits for its send's posting only
            for a in b.batch.actions:
                send = self.side.get(("send", a.transfer())) if a.is_recv else b
                if send is None:
                    return False
                b.done_of[a.transfer()] = max(b.posted, send.posted) + (
                    self.t_comm if a.is_recv else 0.0
                )
            b.started, b.done = b.posted, max(b.done_of.values(), default=b.posted)
            return True
        b.started = self._started(b)
        if b.started is None:
            return False
        others = [
            self.side.get(("recv" if a.is_send else "send", a.transfer())) for a in b.batch.actions
        ]
        starts = [None if o is None else self._started(o) for o in others]
        known = [t for t in starts if t is not None]
        if len(known) < len(starts):
            return False
        begin = max([b.started, *known])
        b.done = begin + self.t_comm + self.cost(b.rank, b.batch)[0]
        b.done_of = {a.transfer(): b.done for a in b.batch.actions}
        return True

    def _started(self, o: _Posted) -> float | None:
        """When a batch starts on its rank's stream: once posted and the batch before it has finished."""
        if o.started is not None:
            return o.started
        prev = self.batches[o.rank][o.index - 1].done if o.index else 0.0
        return None if prev is None else max(o.posted, prev)

    def arrival(self, t: Transfer) -> float | None:
        b = self.side.get(("recv", t))
        return None if b is None else b.done_of.get(t)


def simulate(
    s: Schedule,
    t_f: float = 1.0,
    t_b: float = 2.0,
    t_comm: float = 0.0,
    *,
    cost: Callable[[int, Item], tuple[float, float]] | None = None,
    start: Sequence[float] | None = None,
    rule: str = "nccl",
    batched: bool = True,
    t_w: float | None = None,
    t_fb: float | None = None,
) -> Timeline:
    """The timeline of a schedule from per-action costs, without starting a process. Raises
    ScheduleError on a deadlock under `rule`.

    Uniform costs (the formula's world): t_f, t_b are one rank's share of the model (1/p of it); a chunk's
    forward costs t_f / v, its backward t_b / v (DualPipe's stages are each 1/p of a copy: t_f, t_b), a
    transfer t_comm, posting nothing; a split backward's W costs t_w / v (t_b / 2 unless given) and its
    I the rest of t_b; an F&B pair (actions.py) costs t_fb / v in all (t_f + t_b unless given: on one
    stream nothing overlaps; DualPipe's point is t_fb < t_f + t_b, each half hiding the other's
    communication), shared between its F and its B in proportion. `cost(rank, item) -> (advance,
    busy)` replaces them per item —
    measured costs: a compute action advances the rank's clock by `advance` and is busy for `busy` of it;
    a batch of transfers, once it can run, takes `advance` to finish. `start`: when each rank begins
    (measured: ranks do not enter a step at the same instant); all at 0 by default. `batched=False`
    posts every transfer alone (see actions.py)."""
    if rule not in RULES:
        raise ValueError(f"rule={rule!r}: valid rules are {list(RULES)}")
    t_w = t_b / 2 if t_w is None else t_w
    v = s.model_part(0)[1] / s.p  # stages per rank's share of the model: v, but 1 in DualPipe
    per = {"F": t_f / v, "B": t_b / v, "I": (t_b - t_w) / v, "W": t_w / v}
    paired = 1.0 if t_fb is None else t_fb / (t_f + t_b)  # an F&B pair's share of its parts' cost

    def uniform(rank: int, item: Item) -> tuple[float, float]:
        c = per.get(item.kind, 0.0) * (paired if getattr(item, "pair", None) is not None else 1.0)
        return c, c

    cost = cost or uniform
    programs = [s.program(r, batched) for r in range(s.p)]
    pos, clock = [0] * s.p, list(start) if start is not None else [0.0] * s.p
    streams = _Streams(s.p, rule, t_comm, cost)
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(s.p)]
    needs = [
        {(a.stage, a.microbatch, a.kind[-1]): a.transfer() for a in s.actions[r] if a.is_recv}
        for r in range(s.p)
    ]
    while any(pos[r] < len(programs[r]) for r in range(s.p)):
        progressed = False
        for r in range(s.p):
            while pos[r] < len(programs[r]):
                item = programs[r][pos[r]]
                if isinstance(item, P2PBatch):
                    streams.post(r, item, clock[r])
                else:
                    need = (
                        None
                        if item.kind == "W"
                        else needs[r].get(
                            (item.stage, item.microbatch, "F" if item.kind == "F" else "B")
                        )
                    )
                    if need is not None:
                        streams.resolve()
                        arrived = streams.arrival(need)
                        if arrived is None:
                            break
                        clock[r] = max(clock[r], arrived)
                    (advance, busy), begin = cost(r, item), clock[r]
                    clock[r] += advance
                    spans[r].append((item, begin, begin + busy))
                pos[r] += 1
                progressed = True
        if not progressed:
            raise ScheduleError(_deadlock(programs, pos, rule))
    streams.resolve()
    if any(b.done is None for rank in streams.batches for b in rank):
        raise ScheduleError(_deadlock(programs, pos, rule, streams))
    return Timeline(spans)


def _deadlock(
    programs: list[list[Item]], pos: list[int], rule: str, streams: _Streams | None = None
) -> str:
    stuck = {
        r: f"{program[pos[r]]} (its input never arrives)"
        for r, program in enumerate(programs)
        if pos[r] < len(program)
    }
    if streams is not None:
        stuck.update(
            {
                b.rank: f"{b.batch} never finishes"
                for rank in streams.batches
                for b in rank
                if b.done is None
            }
        )
    how = (
        "batches run in order on each rank's stream and a send waits for its receive"
        if rule == "nccl"
        else "a receive waits for its send"
    )
    return f"deadlock under {rule}'s rule ({how}): {stuck}"
