"""Exercise `ring`: one rank's ring all-reduce (Patarasuk & Yuan 2009), written by the learner as 2(n−1)
exchanges with its neighbours.

The learner's `ring_all_reduce(ring, chunks)` gets this rank's buffer cut into `ring.n` chunks (views: write
into them) and `ring.exchange(t)`, which sends `t` to rank (i+1) mod n and returns what rank (i−1) mod n sent.
Graded in three stages:

- on **simulated ranks** in this process first (exercises/simulated_ranks.py: a thread per rank, queues for
  links; n = 4, then n = 3, so that a fixed 4 in place of ring.n fails): an exception, a deadlock (the rank and
  exchange where it waits), a loop without end (more than 4 × 2(n−1) exchanges, or no return by the deadline),
  chunks replaced instead of changed in place, or a wrong sum stops it before any process starts. Each rank's
  buffer holds 16^r·(position+1), so that every value says how many times each rank's contribution reached it:
  the diagnosis names the chunk that is missing a rank (the off-by-one) or counts one twice (an all-gather
  that adds);
- on **real ranks** (gloo, 4 processes): the same function, its exchanges traced as `ring_step` spans (the
  ring's lane), its sum compared with `dist.all_reduce`'s;
- against the **target**: the bytes each rank put on the wire (summed from the trace) ≤ 2(n−1)/n·S, the
  ring's — a correct answer that sends whole buffers is correct and still fails it.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.exercises.exercise import Exercise
from workbench.exercises.result import Result, Row
from workbench.exercises.simulated_ranks import (
    WAIT_S,
    Deadlock,
    TooMany,
    cap,
    raised,
    run_ranks,
    stopped,
)

#: ranks and values per chunk on both the simulated and the real ranks
RANKS, CHUNK = 4, 256
#: the simulated rings: the real run's size, and another, so that an answer that takes n for a fixed 4 fails
SIMULATED = (RANKS, 3)
#: each rank's contribution is a digit in this base (counts up to 15 decode exactly in float64)
BASE = 16


def inputs(rank: int, n: int) -> torch.Tensor:
    """Rank r's buffer: 16^r·(position+1), float64, n·CHUNK values."""
    return float(BASE**rank) * torch.arange(1, n * CHUNK + 1, dtype=torch.float64)


def chunk_index(t: torch.Tensor, chunks: list[torch.Tensor]) -> int | None:
    """Which of this rank's chunks `t` is (the same memory), or None (a copy, the whole buffer)."""
    for c, chunk in enumerate(chunks):
        if t.data_ptr() == chunk.data_ptr() and t.numel() == chunk.numel():
            return c
    return None


def counts(values: torch.Tensor, offset: int, n: int) -> list[int] | None:
    """How many times each rank's contribution is in `values` (a chunk starting at `offset`), or None where
    its values are not one multiple of positions+1 (a chunk holding another chunk's values)."""
    per = values / torch.arange(offset + 1, offset + values.numel() + 1, dtype=torch.float64)
    if not torch.all(per == per[0]):
        return None
    v = int(round(float(per[0])))
    return [(v // BASE**r) % BASE for r in range(n)]


@dataclass(kw_only=True)
class Sent:
    rank: int
    k: int
    chunk: int | None
    held: list[int] | None
    #: the chunks of this rank that held every rank's values when it made this exchange
    complete: list[int]


@dataclass(kw_only=True)
class SimRing:
    """One simulated rank's side of the ring: `exchange` puts into the next rank's inbox, takes from its own."""

    rank: int
    n: int
    inboxes: list[queue.Queue]
    chunks: list[torch.Tensor]
    sent: list[Sent] = field(default_factory=list)

    def exchange(self, t: torch.Tensor) -> torch.Tensor:
        if len(self.sent) >= cap(2 * (self.n - 1)):
            raise TooMany(
                rank=self.rank,
                expected=f"2(n−1) = {2 * (self.n - 1)}",
                what="exchanges",
                cap=len(self.sent),
            )
        c = chunk_index(t, self.chunks)
        held = counts(t, c * CHUNK, self.n) if c is not None else None
        complete = [
            j
            for j, chunk in enumerate(self.chunks)
            if counts(chunk, j * CHUNK, self.n) == [1] * self.n
        ]
        self.sent.append(
            Sent(
                rank=self.rank,
                k=len(self.sent),
                chunk=c,
                held=held,
                complete=complete,
            )
        )
        self.inboxes[(self.rank + 1) % self.n].put(t.detach().clone())
        try:
            return self.inboxes[self.rank].get(timeout=WAIT_S)
        except queue.Empty:
            raise Deadlock(rank=self.rank, k=len(self.sent) - 1, what="exchange") from None


@dataclass(kw_only=True)
class Simulation:
    rings: list[SimRing]
    buffers: list[torch.Tensor]
    #: each rank's chunks as handed to the learner: views of its buffer
    views: list[list[torch.Tensor]]
    errors: dict[int, BaseException]


def simulate(fn: Any, n: int = RANKS) -> Simulation:
    """Run `fn` for n ranks on threads, each exchange through queues; what each rank sent and holds."""
    inboxes: list[queue.Queue] = [queue.Queue() for _ in range(n)]
    buffers = [inputs(r, n) for r in range(n)]
    views = [list(buffers[r].chunk(n)) for r in range(n)]
    rings = [SimRing(rank=r, n=n, inboxes=inboxes, chunks=list(views[r])) for r in range(n)]
    errors = run_ranks(lambda r: fn(rings[r], rings[r].chunks), n)
    return Simulation(rings=rings, buffers=buffers, views=views, errors=errors)


def replaced(sim: Simulation) -> tuple[int, int] | None:
    """(rank, j) of the first entry of `chunks` the learner replaced with another tensor, or None."""
    for ring, views in zip(sim.rings, sim.views, strict=True):
        for j, (now, view) in enumerate(zip(ring.chunks, views, strict=False)):
            if not isinstance(now, torch.Tensor) or now.data_ptr() != view.data_ptr():
                return ring.rank, j
    return None


def _ranks_in(held: list[int]) -> str:
    return "{" + ", ".join(str(q) for q, x in enumerate(held) if x) + "}"


def diagnose(sim: Simulation, fn: Any) -> str | None:
    """What is wrong with a simulated ring, in a learner's words; None when every rank holds the sum."""
    n = len(sim.rings)
    made = [len(ring.sent) for ring in sim.rings]
    ended = stopped(sim.errors)
    if ended is not None:
        return ended
    errors = {r: e for r, e in sim.errors.items() if not isinstance(e, Deadlock)}
    if errors:
        r, e = min(errors.items())
        return f"rank {r} raised {raised(e, fn)}"
    waiting = {r: e for r, e in sim.errors.items() if isinstance(e, Deadlock)}
    if waiting:
        r = min(waiting)
        prev = (r - 1) % n
        return (
            f"deadlock: rank {r} waits at its exchange {waiting[r].k} for rank {prev}, which made "
            f"{made[prev]} exchanges in all (exchanges per rank: {made}). Every rank must make the same "
            f"exchanges: a ring all-reduce takes 2(n−1) = {2 * (n - 1)} on each."
        )
    found = [
        [counts(sim.buffers[r][c * CHUNK : (c + 1) * CHUNK], c * CHUNK, n) for c in range(n)]
        for r in range(n)
    ]
    if all(held == [1] * n for row in found for held in row):
        return None
    swapped = replaced(sim)
    if swapped is not None:
        r, j = swapped
        return (
            f"rank {r} replaced chunks[{j}] with a new tensor instead of changing it in place (+=, .copy_): "
            "the buffer is what must hold the sum, and chunks are views of it — `chunks[j] = chunks[j] + x` "
            "makes a new tensor and leaves the buffer as it was"
        )
    for r, row in enumerate(found):
        for c, held in enumerate(row):
            if held is None:
                return (
                    f"rank {r}'s chunk {c} ends up holding another chunk's values: what arrives at an "
                    "exchange belongs in the chunk with the same index as the one your neighbour sent"
                )
            if max(held) > 1:
                q = held.index(max(held))
                return (
                    f"rank {r}'s chunk {c} counts rank {q}'s values {held[q]} times: a chunk was added to "
                    f"after it already held the whole sum. In the all-gather phase (exchanges {n - 1}…"
                    f"{2 * n - 3}) each chunk that arrives is complete: copy it into place, do not add it."
                )
    if any(m != 2 * (n - 1) for m in made):
        return (
            f"your ranks made {made} exchanges: a ring takes n−1 = {n - 1} to reduce-scatter (each chunk "
            f"passes n−1 ranks, collecting their values) and n−1 to gather, 2(n−1) = {2 * (n - 1)} on each"
        )
    for k in range(2 * (n - 1)):
        want = k + 1 if k < n - 1 else n
        for ring in sim.rings:
            s = ring.sent[k]
            if s.held is not None and sum(s.held) != want:
                phase = "reduce-scatter" if k < n - 1 else "all-gather"
                if k < n - 1:
                    rule = (
                        "each exchange passes on the running sum that just grew — the chunk you added "
                        "into at the exchange before — and adds what arrives into the chunk your left "
                        "neighbour sent (one way: send chunk (i−k) mod n, add into chunk (i−k−1) mod n)"
                    )
                elif s.complete:
                    rule = (
                        f"after your reduce-scatter (n−1 = {n - 1} exchanges) rank {ring.rank} holds the "
                        f"whole sum of chunk {s.complete[0]} only: start the all-gather from that chunk, "
                        "then pass on the chunk that just arrived"
                    )
                else:
                    rule = (
                        f"after your n−1 = {n - 1} reduce-scatter exchanges no chunk of rank {ring.rank} "
                        "holds every rank's values: each exchange must pass on the chunk that just grew"
                    )
                return (
                    f"off by one in the ring: at exchange {k} ({phase}) rank {ring.rank} sent chunk "
                    f"{s.chunk}, which held the values of ranks {_ranks_in(s.held)}, {sum(s.held)} of {n}; "
                    f"it should hold {want}. The {phase}'s rule: {rule}."
                )
    r, c = next((r, c) for r in range(n) for c in range(n) if found[r][c] != [1] * n)
    held = found[r][c] or []
    return f"rank {r}'s chunk {c} ends with the values of ranks {_ranks_in(held)} only, not all {n}"


class TracedRing:
    """The real ranks' `ring`: each exchange one traced ring step (comm/ring_allreduce.RingCall: a
    `ring_step` span on the ring lane, a flow to the receiver), the whole as one `all_reduce` record."""

    def __init__(self, ctx: Any, buffer: torch.Tensor, label: str) -> None:
        from workbench.comm.ring_allreduce import RingCall

        self.n, self.rank = ctx.world_size, ctx.rank
        self.chunks = list(buffer.chunk(self.n))
        self.k, self.bytes = 0, 0
        self.call = RingCall(ctx.comm, "all_reduce", "dp", buffer, label)

    def exchange(self, t: torch.Tensor) -> torch.Tensor:
        incoming = torch.empty_like(t)
        phase = "reduce_scatter" if self.k < self.n - 1 else "all_gather"
        c = chunk_index(t, self.chunks)
        self.call.exchange(phase, self.k, t.contiguous(), incoming, send_c=c, recv_c=None)
        self.k, self.bytes = self.k + 1, self.bytes + t.numel() * t.element_size()
        return incoming


def on_rank(ctx: Any, fn: Any, settings: dict) -> dict:
    """One real rank: the learner's (or the reference's) ring on this rank's buffer, beside the backend's."""
    import torch.distributed as dist

    from workbench.exercises.on_rank import traced_step

    buffer = inputs(ctx.rank, ctx.world_size)
    want = buffer.clone()
    dist.all_reduce(want)
    with traced_step(ctx, 0):
        ring = TracedRing(ctx, buffer, settings["label"])
        fn(ring, ring.chunks)
        ring.call.finish()
    return {
        "exchanges": ring.k,
        "bytes_sent": ring.bytes,
        "correct": bool(torch.equal(buffer, want)),
    }


def grade(solution: Any, out: str) -> Result:
    """Validate on simulated ranks, run beside the reference on real ones, hold to the ring's bytes."""
    from workbench.config import RunConfig
    from workbench.exercises.grading import at_sizes, grade_function

    def simulated(fn: Any) -> str | None:
        return at_sizes(
            fn,
            sizes=SIMULATED,
            check=lambda f, n: diagnose(simulate(f, n), f),
            size_name="ring.n",
        )

    return grade_function(
        "ring",
        solution,
        function="ring_all_reduce",
        params=("ring", "chunks"),
        simulated=simulated,
        config=RunConfig(dp=RANKS, global_batch=RANKS),
        judge=judge,
        out=out,
    )


def judge(yours: Any, reference: Any) -> Result:
    """The real runs against one process (the backend's all-reduce) and the ring's bytes."""
    from workbench.exercises.ranks import rank_results

    mine = rank_results(yours)
    n, size = len(mine), RANKS * CHUNK * 8
    target = 2 * (n - 1) * size // n
    ev = yours.events
    wire = ev[ev.name == "ring_step"].groupby("rank")["bytes"].sum()
    most = int(wire.max())
    correct = all(m["correct"] for m in mine)
    rows = [
        Row(what="every rank holds what one process sums", yours=correct, target=True, ok=correct),
        Row(
            what="exchanges per rank",
            yours=mine[0]["exchanges"],
            target=2 * (n - 1),
            ok=all(m["exchanges"] == 2 * (n - 1) for m in mine),
        ),
        Row(
            what="bytes a rank sent (most)",
            yours=most,
            target=target,
            ok=most <= target,
            measured=True,
        ),
    ]
    if not correct:
        message = (
            "the real ranks' sums differ from the backend's all-reduce (the simulated ones agreed)"
        )
        return Result(
            exercise="ring",
            passed=False,
            stage="one process",
            message=message,
            rows=rows,
            learner=yours,
            reference=reference,
        )
    if most > target:
        message = (
            f"your ring sums correctly, but a rank sent {most} bytes, {most / size:.2f} × the {size}-byte "
            f"buffer; a ring all-reduce sends 2(n−1)/n·S = {target} ({target / size:.2f} × S): each exchange "
            "carries one chunk (S/n), not the whole buffer"
        )
        return Result(
            exercise="ring",
            passed=False,
            stage="target",
            message=message,
            rows=rows,
            learner=yours,
            reference=reference,
        )
    message = (
        f"every rank holds the sum one process computes, after 2(n−1) = {2 * (n - 1)} exchanges of one chunk "
        f"each: {most} bytes a rank, 2(n−1)/n·S, the least any all-reduce can send"
    )
    return Result(
        exercise="ring",
        passed=True,
        stage="passed",
        message=message,
        rows=rows,
        learner=yours,
        reference=reference,
    )


EXERCISE = Exercise(
    name="ring",
    title="Ring all-reduce: one rank's 2(n−1) exchanges",
    you_write="ring_all_reduce(ring, chunks): n−1 reduce-scatter and n−1 all-gather exchanges",
    target="bytes a rank sends ≤ 2(n−1)/n·S",
    task=(
        "Write one rank's ring all-reduce. `chunks` is this rank's buffer cut into `ring.n` equal chunks "
        "(views: change them in place); `ring.rank` is i; `ring.exchange(t)` sends tensor `t` to rank "
        "(i+1) mod n and returns the tensor rank (i−1) mod n sent at the same exchange (messages number the "
        "exchanges from 0). When your function "
        "returns, every chunk on every rank must hold the sum over all ranks.\n\n"
        "```python\ndef ring_all_reduce(ring, chunks):\n    n, i = ring.n, ring.rank\n    ...\n```\n\n"
        "It runs first on 4 and on 3 simulated ranks (a deadlock or a wrong sum is named before any process starts), "
        "then on 4 gloo processes, traced. Target: each rank sends at most 2(n−1)/n·S bytes of the S-byte "
        "buffer."
    ),
    stub=(
        "def ring_all_reduce(ring, chunks):\n"
        "    n, i = ring.n, ring.rank\n"
        "    # your code: 2(n−1) calls of ring.exchange\n"
    ),
    grade=grade,
)
