"""Pipeline schedules as data (the shape of torch.distributed.pipelining and DeepSpeed's pipe
schedules): each rank gets a list of actions, and the same list is validated, simulated without
processes, drawn, written to schedule.json, and executed.

Stages: the model is cut into S = p·v stages; stage k lives on rank k mod p as its chunk k // p
(Megatron-LM's interleaving; v = 1 is the usual one stage per rank). An action is

    F  / B               forward / backward of `microbatch` on `stage`
    SEND_F / RECV_F      the activation from `stage` to `peer` (= stage + 1)
    SEND_B / RECV_B      the gradient from `stage` to `peer` (= stage − 1)

written as torch pipelining does: "2F5" is stage 2's forward of microbatch 5.

Schedules (p stages, m microbatches):
- GPipe (Huang et al. 2019): all m forwards, then all m backwards. Holds m microbatches' activations.
- 1F1B (PipeDream-Flush, Narayanan et al. 2019/2021): warm-up of p − s − 1 forwards on stage s, then
  one forward / one backward alternately (steady state), then the remaining backwards (cool-down).
  Holds at most p − s microbatches.
- Interleaved 1F1B (Narayanan et al. 2021, §2.2): v chunks per rank, microbatches in groups of p;
  warm-up of 2(p − r − 1) + (v − 1)·p forward chunks on rank r. Bubble shrinks by v.

Send actions are asynchronous and receive actions block until the matching send has been posted;
`validate` simulates exactly that to prove a schedule cannot deadlock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

COMPUTE = ("F", "B")
KINDS = ("F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B")


@dataclass(frozen=True)
class Action:
    kind: str
    stage: int
    microbatch: int
    peer: int | None = None  # the other stage of a send or receive

    def __str__(self) -> str:
        if self.kind in COMPUTE:
            return f"{self.stage}{self.kind}{self.microbatch}"
        return f"{self.kind} {self.stage}→{self.peer} mb{self.microbatch}" if self.kind.startswith("SEND") else \
            f"{self.kind} {self.peer}→{self.stage} mb{self.microbatch}"


@dataclass
class Schedule:
    name: str
    p: int
    m: int
    v: int
    actions: list[list[Action]] = field(default_factory=list)  # per rank

    @property
    def stages(self) -> int:
        return self.p * self.v

    def rank_of(self, stage: int) -> int:
        return stage % self.p

    def chunk_of(self, stage: int) -> int:
        return stage // self.p

    def to_dict(self) -> dict:
        return {"name": self.name, "p": self.p, "m": self.m, "v": self.v,
                "actions": [[{**asdict(a), "label": str(a)} for a in rank] for rank in self.actions]}

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        acts = [[Action(a["kind"], a["stage"], a["microbatch"], a.get("peer")) for a in rank] for rank in d["actions"]]
        return cls(d["name"], d["p"], d["m"], d["v"], acts)

    def grid(self) -> str:
        """The compute actions as text, one line per rank (torch pipelining's printout)."""
        return "\n".join(f"rank {r}: " + " ".join(str(a) for a in acts if a.kind in COMPUTE)
                         for r, acts in enumerate(self.actions))


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


def build_schedule(name: str, p: int, m: int, v: int = 1) -> Schedule:
    """Every rank's actions: compute actions in the schedule's order, each forward preceded by the
    receive of its input and followed by the send of its output (and the reverse for backward)."""
    if name != "interleaved" and v != 1:
        raise ValueError(f"schedule {name!r} runs one stage per rank: virtual_stages must be 1, got {v}")
    if name == "interleaved" and m % p:
        raise ValueError(f"interleaved 1F1B needs microbatches divisible by pp: m={m}, p={p}")
    sched = Schedule(name, p, m, v)
    last = p * v - 1
    for rank in range(p):
        acts: list[Action] = []
        for kind, stage, mb in _compute_order(name, p, m, v, rank):
            if kind == "F":
                if stage > 0:
                    acts.append(Action("RECV_F", stage, mb, stage - 1))
                acts.append(Action("F", stage, mb))
                if stage < last:
                    acts.append(Action("SEND_F", stage, mb, stage + 1))
            else:
                if stage < last:
                    acts.append(Action("RECV_B", stage, mb, stage + 1))
                acts.append(Action("B", stage, mb))
                if stage > 0:
                    acts.append(Action("SEND_B", stage, mb, stage - 1))
        sched.actions.append(acts)
    return sched


# ---- validation and simulation ------------------------------------------------------------------
class ScheduleError(ValueError):
    pass


def matching_send(a: Action) -> tuple[str, int, int, int]:
    """The send a receive waits for: (kind, from stage, to stage, microbatch)."""
    return ("SEND_F" if a.kind == "RECV_F" else "SEND_B", a.peer, a.stage, a.microbatch)


def validate(s: Schedule) -> list[str]:
    """Problems with a schedule (empty = valid): every (stage, microbatch) forwarded and backwarded
    exactly once, on the right rank, forward first; every send matched by one receive; and no deadlock
    when sends are asynchronous and receives block."""
    errors: list[str] = []
    if len(s.actions) != s.p:
        return [f"{len(s.actions)} action lists for {s.p} ranks"]
    seen: dict[tuple[str, int, int], int] = defaultdict(int)
    sends, recvs = set(), set()
    for rank, acts in enumerate(s.actions):
        done_f: set[tuple[int, int]] = set()
        for a in acts:
            if a.kind not in KINDS:
                errors.append(f"rank {rank}: unknown action kind {a.kind!r}")
                continue
            if s.rank_of(a.stage) != rank:
                errors.append(f"rank {rank}: {a} belongs to stage {a.stage}, which lives on rank {s.rank_of(a.stage)}")
            if a.kind in COMPUTE:
                seen[(a.kind, a.stage, a.microbatch)] += 1
                if a.kind == "F":
                    done_f.add((a.stage, a.microbatch))
                elif (a.stage, a.microbatch) not in done_f:
                    errors.append(f"rank {rank}: {a} runs before its forward")
            elif a.kind.startswith("SEND"):
                sends.add((a.kind, a.stage, a.peer, a.microbatch))
            else:
                recvs.add(matching_send(a))
    for kind in COMPUTE:
        for stage in range(s.stages):
            for mb in range(s.m):
                n = seen.get((kind, stage, mb), 0)
                if n != 1:
                    errors.append(f"{stage}{kind}{mb} appears {n} times (want 1)")
    for send in sorted(sends - recvs):
        errors.append(f"{send[0]} {send[1]}→{send[2]} mb{send[3]} is never received")
    for send in sorted(recvs - sends):
        errors.append(f"a receive waits for {send[0]} {send[1]}→{send[2]} mb{send[3]}, which is never sent")
    if not errors:
        try:
            simulate(s)
        except ScheduleError as e:
            errors.append(str(e))
    return errors


@dataclass
class Timeline:
    """Simulated (or measured) compute intervals: per rank, (action, start, end)."""

    spans: list[list[tuple[Action, float, float]]]

    @property
    def makespan(self) -> float:
        return max((e for rank in self.spans for _, _, e in rank), default=0.0)

    def bubble_fraction(self) -> float:
        """Idle share of the step, averaged over ranks: 1 − busy / makespan."""
        total = self.makespan
        if total <= 0:
            return 0.0
        busy = [sum(e - b for _, b, e in rank) for rank in self.spans]
        return sum(1 - x / total for x in busy) / len(busy)


def simulate(s: Schedule, t_f: float = 1.0, t_b: float = 2.0, t_comm: float = 0.0,
             cost: Callable[[int, Action], tuple[float, float]] | None = None,
             start: Sequence[float] | None = None) -> Timeline:
    """The timeline of a schedule from per-action costs, without starting a process. Raises
    ScheduleError on a deadlock.

    Uniform costs (the formula's world): a chunk's forward costs t_f / v, its backward t_b / v, a
    transfer t_comm, sends and receives nothing else. `cost(rank, action) -> (advance, busy)` replaces
    them per action — measured costs: a compute action advances the rank's clock by `advance` and is
    busy for `busy` of it; a send advances the clock by its launch cost; a receive, once its send is
    posted, by the transfer's time. `start`: when each rank begins (measured: ranks do not enter a step
    at the same instant); all at 0 by default."""
    per = {"F": t_f / s.v, "B": t_b / s.v}
    cost = cost or (lambda r, a: (per.get(a.kind, 0.0), per.get(a.kind, 0.0)))
    pos, clock = [0] * s.p, list(start) if start is not None else [0.0] * s.p
    posted: dict[tuple[str, int, int, int], float] = {}
    spans: list[list[tuple[Action, float, float]]] = [[] for _ in range(s.p)]
    remaining = sum(len(a) for a in s.actions)
    while remaining:
        progressed = False
        for r in range(s.p):
            while pos[r] < len(s.actions[r]):
                a = s.actions[r][pos[r]]
                if a.kind.startswith("RECV"):
                    if (key := matching_send(a)) not in posted:
                        break
                    clock[r] = max(clock[r], posted[key] + t_comm) + cost(r, a)[0]
                elif a.kind.startswith("SEND"):
                    posted[(a.kind, a.stage, a.peer, a.microbatch)] = clock[r]
                    clock[r] += cost(r, a)[0]
                else:
                    (advance, busy), start = cost(r, a), clock[r]
                    clock[r] += advance
                    spans[r].append((a, start, start + busy))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(s.actions[r][pos[r]]) for r in range(s.p) if pos[r] < len(s.actions[r])}
            raise ScheduleError(f"deadlock: every unfinished rank waits on a receive whose send is never "
                                f"posted first: {stuck}")
    return Timeline(spans)


def peak_in_flight(s: Schedule) -> list[int]:
    """Per rank, the most (stage, microbatch) forwards whose backward has not run yet: the activations
    the schedule makes a rank hold at once."""
    out = []
    for acts in s.actions:
        live = peak = 0
        for a in acts:
            if a.kind == "F":
                live += 1
                peak = max(peak, live)
            elif a.kind == "B":
                live -= 1
        out.append(peak)
    return out
