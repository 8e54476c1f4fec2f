"""A run's execution graph, read back from its traces — the input of the trace-driven replay
(analysis/replay.py) and of its "what if" edits (analysis/what_if.py).

The graph is what Lumos (Liang et al., MLSys 2025) builds from Kineto traces, cut to what our traces hold.
Each rank has a *program*: what its host did, in the order it did it —

    busy    a stretch the rank spent on its own: forward, backward, recompute, optimizer (the compute lane's
            spans), launching an operation, an emulated link's hold on a send, and everything else (`host`:
            Python, data)
    issue   the rank posted a communication operation (a collective, or one transfer of a p2p batch)
    block   the rank could not go on until these operations were done (the `wait` lane's spans, and a
            blocking collective's own span); `us` is what it spent after they were done (copying out,
            bookkeeping): its *residual*
    mark    a step began or ended (`ProfilerStep#n`)

and the operations tie the programs together. An operation completes `cost_us` after the later of
(a) the last of its members issuing it and (b) a free worker on its queue: a process group takes its
collectives in order onto `SLOTS` workers (gloo's ProcessGroupGloo runs two threads by default, so two of
its collectives can be in flight at once; NCCL one stream per group); transfers queue on nothing. From
the measurement:

    completion C  = each member's own (gloo's future, or its blocking span's end): a member's queue may hold
                    it behind its own earlier operations; a transfer's is its receiver's (the sender's send
                    is done on its own, `send_us` after posting it: gloo buffers it)
    cost          = C − max(last issue, the member's previous completion on its queue), clamped at 0: the
                    least over the members is `cost_us`, what a member took beyond it `extra_us`
    residual      = a block's end − max(its start, the completion of the latest operation it waited for)

So every duration in the graph is measured, and replaying it unedited reproduces the run: where it does
not, the graph misses a dependency (or the ranks' clocks disagree, which the clamps absorb). No torch.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from workbench.trace.recorder import LANES

#: how many of a process group's collectives run at once, by backend (see the module docstring)
SLOTS = {"gloo": 2, "nccl": 1}
#: compute-lane categories a busy stretch is tagged with (the innermost span wins)
COMPUTE = ("forward", "backward", "recompute", "optimizer")


@dataclass(kw_only=True)
class Item:
    """One entry of a rank's program (see the module docstring)."""

    kind: str  # 'busy', 'issue', 'block' or 'mark'
    us: float = 0.0  # busy: its length; block: the residual; issue: a hold before posting (an emulated send)
    keys: tuple[Any, ...] = ()  # issue: (the operation,); block: the operations awaited
    tag: str = "host"  # busy: COMPUTE, 'emulated' or 'host'; mark: 'start' or 'end'
    step: int = -1
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class OpNode:
    """One communication operation, as every member saw it."""

    key: tuple[Any, ...]
    op: str  # all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, send (a transfer)
    group: str
    members: tuple[int, ...]
    nbytes: int
    step: int
    cost_us: float
    queue: tuple[Any, ...] | None  # operations on one queue complete one after another, in `order`
    order: float = 0.0  # place in its queue: a split operation slots its parts between two others
    label: str = ""
    emulated_s: float = 0.0
    # a member that completed later: by how much
    extra_us: dict[int, float] = field(default_factory=dict)
    # a blocking collective (an emulated link holds it after it is done, not beside it)
    blocking: bool = False
    # a transfer: its sender, whose send is done `send_us` after it posted it (gloo's send needs no receive
    # posted: the receiver's completion is the transfer's)
    sender: int = -1
    send_us: float = 0.0


@dataclass(kw_only=True)
class Graph:
    programs: dict[int, list[Item]]
    ops: dict[tuple[Any, ...], OpNode]
    start_us: dict[int, float]  # when each rank began its first step, on the shared clock
    measured_us: dict[int, dict[int, float]]  # rank → step → its ProfilerStep's length
    # rank → step → measured compute / blocked / host
    lanes_us: dict[int, dict[int, dict[str, float]]]
    config: dict[str, Any]
    slots: int = 2  # SLOTS of the run's backend
    #: each rank's parameters' sizes (values), in the model's order (the trace's `param_shapes`)
    param_sizes: dict[int, list[int]] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.programs)


def _key(args: dict[str, Any]) -> tuple[Any, ...]:
    """An operation's identity on every member: a collective by its group and sequence number, a
    transfer by its flow (the same id on the send and on the receive)."""
    if args["op"] in ("send", "recv"):
        return ("p2p", args["flow"])
    return ("c", args["group"], tuple(args.get("group_ranks", ())), args["seq"])


class _Rank:
    """One rank's trace, read into points in time (shifted by `offset` µs: clock_offsets)."""

    def __init__(self, trace: dict[str, Any], offset: float = 0.0) -> None:
        self.rank = trace["distributedInfo"]["rank"]
        ev = (
            [{**e, "ts": e["ts"] + offset} if "ts" in e else e for e in trace["traceEvents"]]
            if offset
            else trace["traceEvents"]
        )
        self.steps = {
            e["args"]["step"]: (e["ts"], e["ts"] + e["dur"])
            for e in ev
            if e.get("ph") == "X" and e.get("cat") == "step" and e.get("tid") == LANES["compute"]
        }
        begins = {
            e["id2"]["local"]: e for e in ev if e.get("ph") == "b" and e.get("tid") == LANES["comm"]
        }
        ends = {
            e["id2"]["local"]: e["ts"]
            for e in ev
            if e.get("ph") == "e" and e.get("tid") == LANES["comm"]
        }
        #: key → (issue µs, completion µs or None, args)
        self.issued: dict[tuple[Any, ...], tuple[float, float | None, dict[str, Any]]] = {}
        # (start, end, keys, args)
        self.blocks: list[tuple[float, float, tuple[Any, ...], dict[str, Any]]] = []
        self.blocking: set[tuple[Any, ...]] = set()
        by_launch: dict[float, list[tuple[Any, ...]]] = {}
        by_seq: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for local, e in begins.items():
            a = e["args"]
            if "op" not in a or ("flow" not in a and a["op"] in ("send", "recv")):
                continue
            k = _key(a)
            self.issued[k] = (e["ts"], ends.get(local), a)
            by_launch.setdefault(round(e["ts"], 1), []).append(k)
            by_seq[(a["op"], a["group"], a.get("seq"), a.get("step"))] = k
        for e in ev:
            if e.get("ph") != "X":
                continue
            a = e.get("args", {})
            # blocking
            if e.get("tid") == LANES["comm"] and e.get("cat") == "collective" and "seq" in a:
                k = _key(a)
                self.issued[k] = (e["ts"], e["ts"] + e["dur"], a)
                self.blocking.add(k)
                self.blocks.append((e["ts"], e["ts"] + e["dur"], (k,), a))
            elif e.get("tid") == LANES["wait"] and e.get("cat") == "wait" and "op" in a:
                posted = by_seq.get((a["op"], a["group"], a.get("seq"), a.get("step")))
                if posted is not None:  # the batch: every operation posted with it
                    batch = tuple(by_launch[round(self.issued[posted][0], 1)])
                    self.blocks.append((e["ts"], e["ts"] + e["dur"], batch, a))
        self.tagged = sorted(
            [
                (e["ts"], e["ts"] + e["dur"], e["cat"], e.get("args", {}))
                for e in ev
                if e.get("ph") == "X"
                and (
                    (e.get("tid") == LANES["compute"] and e.get("cat") in COMPUTE)
                    or (e.get("tid") == LANES["launch"] and e.get("cat") in ("emulated", "launch"))
                )
            ],
            key=lambda x: (x[0], -x[1]),
        )
        self.tag_starts = [t[0] for t in self.tagged]

    def pieces(self, a: float, b: float) -> list[tuple[float, str, dict[str, Any]]]:
        """[a, b) cut by the tagged spans: (length, tag, args); the innermost span wins, untagged is 'host'."""
        cuts = {a, b}
        # spans starting earlier may still cover a
        lo = max(0, bisect.bisect_left(self.tag_starts, a) - 64)
        hi = bisect.bisect_right(self.tag_starts, b)
        near = [t for t in self.tagged[lo:hi] if t[1] > a and t[0] < b]
        for s, e, _, _ in near:
            cuts.update(x for x in (s, e) if a < x < b)
        points = sorted(cuts)
        out = []
        for x, y in zip(points, points[1:], strict=False):
            inside = [t for t in near if t[0] <= x and t[1] >= y]
            if inside:
                s, e, tag, args = min(inside, key=lambda t: t[1] - t[0])
                out.append((y - x, tag, args))
            else:
                out.append((y - x, "host", {}))
        return out


def _program(r: _Rank, steps: list[int]) -> tuple[list[Item], dict[int, dict[str, float]]]:
    """The rank's items from the start of its first step in `steps` to the end of its last, and per step
    the measured compute / blocked / host time."""
    lo, hi = r.steps[steps[0]][0], r.steps[steps[-1]][1]
    # (time, order at a tie, item, end of a block)
    points: list[tuple[float, int, Item, float]] = []
    for k in steps:
        points.append((r.steps[k][0], 0, Item(kind="mark", tag="start", step=k), 0.0))
        points.append((r.steps[k][1], 3, Item(kind="mark", tag="end", step=k), 0.0))
    for key, (t, _, a) in r.issued.items():
        if lo <= t <= hi:
            points.append((t, 1, Item(kind="issue", keys=(key,), step=a.get("step", -1)), 0.0))
    for s, e, keys, a in r.blocks:
        if lo <= s <= hi:
            points.append(
                (
                    s,
                    2,
                    Item(
                        kind="block", keys=keys, step=a.get("step", -1), meta={"start": s, "end": e}
                    ),
                    e,
                )
            )
    points.sort(key=lambda p: (p[0], p[1]))
    items: list[Item] = []
    lanes: dict[int, dict[str, float]] = {}
    cursor, step = lo, steps[0]
    for t, _, item, end in points:
        if t > cursor:
            for length, tag, args in r.pieces(cursor, t):
                meta = (
                    {"link": args.get("link"), "seconds": args.get("seconds")}
                    if tag == "emulated"
                    else {"label": args.get("label", ""), "seq": args.get("seq")}
                    if tag == "launch"
                    else {}
                )
                items.append(
                    Item(
                        kind="busy",
                        us=length,
                        tag="compute" if tag in COMPUTE else tag,
                        step=step,
                        meta={"kind": tag, **meta},
                    )
                )
                share = lanes.setdefault(step, {"compute": 0.0, "blocked": 0.0, "host": 0.0})
                share["compute" if tag in COMPUTE else "host"] += length
            cursor = t
        if item.kind == "mark" and item.tag == "start":
            step = item.step
        items.append(item)
        if item.kind == "block":
            blocked = max(0.0, end - cursor)
            lanes.setdefault(step, {"compute": 0.0, "blocked": 0.0, "host": 0.0})["blocked"] += (
                blocked
            )
            cursor = max(cursor, end)
    return items, lanes


def build(
    traces: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
    steps: list[int] | None = None,
) -> Graph:
    """The execution graph of the steps every rank completed (all of them unless `steps` says which), each
    rank's clock first shifted so that no operation completes before one of its members issued it
    (clock_offsets)."""
    ranks = {r.rank: r for r in (_Rank(t) for t in traces)}
    offsets = clock_offsets(ranks)
    if any(offsets.values()):
        ranks = {
            r.rank: r for r in (_Rank(t, offsets[t["distributedInfo"]["rank"]]) for t in traces)
        }
    common = sorted(set.intersection(*(set(r.steps) for r in ranks.values())))
    steps = sorted(set(steps) & set(common)) if steps is not None else common
    if not steps:
        raise ValueError("no step that every rank's trace holds whole: nothing to replay")
    programs, lanes = {}, {}
    for rank, r in ranks.items():
        programs[rank], lanes[rank] = _program(r, steps)
    backend = traces[0]["distributedInfo"].get("backend", "gloo")
    slots = SLOTS.get(backend, 1)
    ops = _operations(ranks, programs, slots)
    _residuals(programs, ops, ranks, slots)
    sizes = {
        t["distributedInfo"]["rank"]: [
            math.prod(shape) for shape in t.get("workbench", {}).get("param_shapes", {}).values()
        ]
        for t in traces
    }
    return Graph(
        programs=programs,
        ops=ops,
        start_us={k: r.steps[steps[0]][0] for k, r in ranks.items()},
        measured_us={
            k: {s: r.steps[s][1] - r.steps[s][0] for s in steps} for k, r in ranks.items()
        },
        lanes_us=lanes,
        config=config or {},
        slots=slots,
        param_sizes=sizes,
    )


class Workers:
    """Each (queue, member)'s workers: when each is next free. An operation takes the one free first, in the
    queue's order."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.free: dict[tuple[Any, ...], list[float]] = {}

    def start(self, queue: tuple[Any, ...], member: int, ready: float) -> tuple[float, int]:
        """When an operation ready at `ready` can start on the member's queue, and the worker it takes."""
        free = self.free.setdefault((queue, member), [float("-inf")] * self.slots)
        slot = min(range(self.slots), key=free.__getitem__)
        return max(ready, free[slot]), slot

    def done(self, queue: tuple[Any, ...], member: int, slot: int, t: float) -> None:
        self.free[(queue, member)][slot] = t


def clock_offsets(ranks: dict[int, _Rank]) -> dict[int, float]:
    """µs to add to each rank's clock so that every operation completes, on each member, no earlier than
    every member issued it. The ranks agree on one epoch at start-up (run-format.md), but on a loaded
    machine to within a millisecond or so; an all-reduce that one rank finished before another issued it
    shows that. Each such pair gives δ_i − δ_j ≥ t_j − c_i (i completed at c_i, j issued at t_j): the least
    non-negative shifts that meet them all, by longest paths (Bellman–Ford, at most n passes; what a
    cycle of contradictions leaves is absorbed by the costs' clamps). Traces that agree get none."""
    bound: dict[tuple[int, int], float] = {}
    for k in set().union(*(set(r.issued) for r in ranks.values())):
        views = {rank: r.issued[k] for rank, r in ranks.items() if k in r.issued}
        if len(views) < 2:
            continue
        for i, (_, c_i, a_i) in views.items():
            if c_i is None or a_i["op"] == "send":  # a send completes on its own (gloo buffers it)
                continue
            for j, (t_j, _, _) in views.items():
                if j != i and t_j - c_i > bound.get((i, j), 0.0):
                    bound[(i, j)] = t_j - c_i
    delta = dict.fromkeys(ranks, 0.0)
    for _ in range(len(ranks)):
        changed = False
        for (i, j), b in bound.items():
            if delta[i] < delta[j] + b:
                delta[i], changed = delta[j] + b, True
        if not changed:
            break
    return delta


def _operations(
    ranks: dict[int, _Rank], programs: dict[int, list[Item]], slots: int
) -> dict[tuple[Any, ...], OpNode]:
    """Every operation some program issues, with its measured cost (module docstring)."""
    keys = {it.keys[0] for p in programs.values() for it in p if it.kind == "issue"}
    seen: dict[tuple[Any, ...], list[tuple[int, float, float | None, dict[str, Any]]]] = {}
    for rank, r in ranks.items():
        for k in keys & set(r.issued):
            t, c, a = r.issued[k]
            seen.setdefault(k, []).append((rank, t, c, a))
    ops: dict[tuple[Any, ...], OpNode] = {}
    for k, views in seen.items():
        sender = next((v for v in views if v[3]["op"] == "send"), views[0])
        a = sender[3]
        members = (sender[0], a["peer"]) if k[0] == "p2p" else tuple(a.get("group_ranks", ()))
        ops[k] = OpNode(
            key=k,
            op="send" if k[0] == "p2p" else a["op"],
            group=a["group"],
            members=tuple(sorted(members)),
            nbytes=int(a.get("bytes", 0)),
            step=int(a.get("step", -1)),
            cost_us=0.0,
            queue=None if k[0] == "p2p" else ("queue", a["group"], members),
            order=a.get("seq", 0),
            label=str(a.get("label", "")),
            emulated_s=float(a.get("emulated_s", 0.0)),
        )
        if k[0] == "p2p":
            # the send's own completion is not recorded apart from its batch's (whose receive it may have
            # waited for): 0, and its block's residual keeps what the send itself took
            ops[k].sender, ops[k].send_us = sender[0], 0.0
    for r in ranks.values():
        for k in r.blocking & set(ops):
            ops[k].blocking = True
    measured = {
        (k, rank): c for k, views in seen.items() for rank, _, c, a in views if c is not None
    }
    earliest = {
        k: min((c for _, _, c, _ in views if c is not None), default=None)
        for k, views in seen.items()
    }
    issued = {(k, rank): t for k, views in seen.items() for rank, t, _, _ in views}
    workers = Workers(slots)
    for node in sorted(ops.values(), key=lambda n: n.order if n.queue else 0):
        last = max(issued[(node.key, m)] for m in node.members if (node.key, m) in issued)
        costs = {}
        for m in _completing(node):
            start, slot = workers.start(node.queue, m, last) if node.queue else (last, 0)
            c = measured.get((node.key, m))
            if c is None:  # not recorded on this member: the earliest any member recorded
                first = earliest[node.key]
                c = first if first is not None else start
            costs[m] = max(0.0, c - start)
            if node.queue:
                workers.done(node.queue, m, slot, start + costs[m])
        node.cost_us = min(costs.values(), default=0.0)
        node.extra_us = {m: c - node.cost_us for m, c in costs.items() if c > node.cost_us}
    return ops


def _completing(node: OpNode) -> tuple[int, ...]:
    """The members whose completion the operation decides: every member of a collective, a transfer's
    receiver (its sender's send is done on its own)."""
    return tuple(m for m in node.members if m != node.sender) or node.members[:1]


class Completions:
    """The operations' completions as their members issue them (the replay's, and the residuals'): a
    collective's member completes `cost_us` (+ its `extra_us`) after the later of the last issue and a free
    worker on its queue, the queue taken in its order; a transfer's receiver `cost_us` after the later
    issue, its sender `send_us` after its own."""

    def __init__(self, ops: dict[tuple[Any, ...], OpNode], slots: int) -> None:
        self.ops = ops
        self.issued: dict[tuple[Any, ...], dict[int, float]] = {}
        self.done: dict[tuple[tuple[Any, ...], int], float] = {}
        self.queues: dict[tuple[Any, ...], list[OpNode]] = {}
        for node in sorted(ops.values(), key=lambda n: n.order):
            for m in _completing(node) if node.queue is not None else ():
                self.queues.setdefault((node.queue, m), []).append(node)
        self.head = dict.fromkeys(self.queues, 0)
        self.workers = Workers(slots)

    def issue(self, key: tuple[Any, ...], rank: int, t: float) -> None:
        self.issued.setdefault(key, {})[rank] = t
        node = self.ops.get(key)
        if node is None:
            return
        if node.sender == rank:
            self.done[(key, rank)] = t + node.send_us
        if set(self.issued[key]) < set(node.members):
            return
        if node.queue is None:
            for m in _completing(node):
                self.done[(key, m)] = (
                    max(self.issued[key].values()) + node.cost_us + node.extra_us.get(m, 0.0)
                )
            return
        for m in _completing(node):
            self._advance(node.queue, m)

    def _advance(self, queue: tuple[Any, ...], m: int) -> None:
        """Complete the head of member m's queue, in order, as far as its members have issued."""
        q = (queue, m)
        nodes = self.queues[q]
        while self.head[q] < len(nodes):
            node = nodes[self.head[q]]
            times = self.issued.get(node.key, {})
            if set(times) < set(node.members):
                return
            start, slot = self.workers.start(queue, m, max(times.values()))
            self.done[(node.key, m)] = start + node.cost_us + node.extra_us.get(m, 0.0)
            self.workers.done(queue, m, slot, self.done[(node.key, m)])
            self.head[q] += 1


def _residuals(
    programs: dict[int, list[Item]],
    ops: dict[tuple[Any, ...], OpNode],
    ranks: dict[int, _Rank],
    slots: int,
) -> None:
    """Each block's residual: what its end came after the later of its start and its operations' completion
    for this rank (recomputed from the issues, queues and costs, as the replay will)."""
    completions = Completions(ops, slots)
    for k in ops:
        for rank, r in ranks.items():
            if k in r.issued:
                completions.issue(k, rank, r.issued[k][0])
    done = completions.done
    for rank, program in programs.items():
        for it in program:
            if it.kind == "block":
                ready = max(
                    (done[(k, rank)] for k in it.keys if (k, rank) in done),
                    default=it.meta["start"],
                )
                it.us = max(0.0, it.meta["end"] - max(it.meta["start"], ready))
