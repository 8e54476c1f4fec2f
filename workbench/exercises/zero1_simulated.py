"""The ZeRO-1 exercise's simulated ranks (exercises/zero1.py grades with them before any process starts) and
the update both the simulated and the real ranks call.

`simulate(fn, n)` runs the learner's step once on n threads (exercises/simulated_ranks.py's harness; zero1.py
simulates n = 4, the real run's, then n = 3: the buffer, n × PER_RANK values, divides by either), each with
its `dp` (SimDP: the collectives done between the threads, a barrier where they meet) and its own `update`
(ShardAdamW, which keeps what it was given); `diagnose` says in a learner's words what went wrong: an
exception, collectives that differ or never come, a loop that does not end, the update called more than once,
on a slice the rank does not own, with the sum of the gradients or the rank's own, and the ranks left holding
stale values (no all-gather)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.exercises.simulated_ranks import (
    WAIT_S,
    Deadlock,
    TooMany,
    cap,
    raised,
    run_ranks,
    stopped,
)

#: ranks run for real (and simulated); values a simulated rank owns
RANKS, PER_RANK = 4, 64
#: the simulated sizes: the real run's, and another, so that a fixed 4 in place of dp.size fails
SIMULATED = (RANKS, 3)
#: the collectives a ZeRO-1 step takes: a reduce-scatter (or an all-reduce) and an all-gather
COLLECTIVES = 2
#: AdamW's learning rate
LR = 1e-2


class ShardAdamW:
    """`update(shard_params, shard_grads)`: AdamW (decoupled weight decay 0, the padding stays 0) on one shard,
    in place. Its moments (exp_avg, exp_avg_sq: 8 bytes a value) are made on the first call, as big as the
    shard given; a later call must give as many values. `recorder`: each call a span on the compute lane;
    `keep`: a copy of what each call was given (the simulation's diagnosis reads it)."""

    def __init__(self, *, lr: float = LR, recorder: Any = None, keep: bool = False) -> None:
        self.lr, self.betas, self.eps = lr, (0.9, 0.999), 1e-8
        self.state: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.recorder, self.keep = recorder, keep
        #: (the parameters as they came, the gradients) of each call: what the simulation diagnoses
        self.calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    @property
    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state.values())

    def __call__(self, shard_params: torch.Tensor, shard_grads: torch.Tensor) -> None:
        if shard_params.shape != shard_grads.shape:
            raise ValueError(
                f"update(shard_params, shard_grads): shapes {tuple(shard_params.shape)} and "
                f"{tuple(shard_grads.shape)} differ; give the gradients of the values you update"
            )
        if self.keep:
            self.calls.append((shard_params.detach().clone(), shard_grads.detach().clone()))
        if not self.state:
            self.state = {
                "exp_avg": torch.zeros_like(shard_params),
                "exp_avg_sq": torch.zeros_like(shard_params),
            }
        elif self.state["exp_avg"].numel() != shard_params.numel():
            raise ValueError(
                f"update was first given {self.state['exp_avg'].numel()} values and now "
                f"{shard_params.numel()}: its moments belong to the first shard; call it once a step "
                "with your shard"
            )
        if self.recorder is None:
            self._step(shard_params, shard_grads)
            return
        with self.recorder.span("adamw shard", "optimizer", "compute", numel=shard_params.numel()):
            self._step(shard_params, shard_grads)

    @torch.no_grad()
    def _step(self, p: torch.Tensor, g: torch.Tensor) -> None:
        self.steps += 1
        (b1, b2), m, v = self.betas, self.state["exp_avg"], self.state["exp_avg_sq"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / (1 - b2**self.steps)).sqrt_().add_(self.eps)
        p.addcdiv_(m, denom, value=-self.lr / (1 - b1**self.steps))


# ---- simulated ranks -------------------------------------------------------------------------------------
class Mismatch(Exception):
    pass


@dataclass(kw_only=True)
class SimGroup:
    """The collectives between the simulated ranks: each rank leaves its input, all meet at a barrier (a
    deadlock breaks it after WAIT_S), each takes what it needs, all meet again before the next one."""

    n: int
    barrier: threading.Barrier
    slots: list[Any]
    made: list[list[str]]

    def meet(self, rank: int, op: str, t: torch.Tensor) -> list[torch.Tensor]:
        k = len(self.made[rank])
        if k >= cap(COLLECTIVES):
            raise TooMany(
                rank=rank,
                expected=f"{COLLECTIVES} collectives (a reduce-scatter, an all-gather)",
                what="in one step",
                cap=k,
            )
        self.made[rank].append(op)
        self.slots[rank] = (op, t.detach().clone())
        try:
            self.barrier.wait()
            ops = [slot[0] for slot in self.slots]
            inputs = [slot[1] for slot in self.slots]
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise Deadlock(rank=rank, k=k, what=f"collective ({op})") from None
        if len(set(ops)) > 1:
            calls = ", ".join(f"rank {q}: {o}" for q, o in enumerate(ops))
            raise Mismatch(f"at collective {k} the ranks called different collectives ({calls})")
        return inputs


@dataclass(kw_only=True)
class SimDP:
    """One simulated rank's `dp`."""

    rank: int
    size: int
    group: SimGroup

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if inp.numel() != self.size * out.numel():
            raise ValueError(
                f"dp.reduce_scatter(out, inp): inp has {inp.numel()} values, out {out.numel()}; inp must "
                f"have n = {self.size} times out's"
            )
        total = torch.stack(self.group.meet(self.rank, "reduce_scatter", inp.reshape(-1))).sum(0)
        out.view(-1).copy_(total.chunk(self.size)[self.rank])

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if out.numel() != self.size * inp.numel():
            raise ValueError(
                f"dp.all_gather(out, inp): out has {out.numel()} values, inp {inp.numel()}; out must "
                f"have n = {self.size} times inp's"
            )
        out.view(-1).copy_(torch.cat(self.group.meet(self.rank, "all_gather", inp.reshape(-1))))

    def all_reduce(self, t: torch.Tensor) -> None:
        t.copy_(torch.stack(self.group.meet(self.rank, "all_reduce", t)).sum(0))


@dataclass(kw_only=True)
class Simulation:
    start: torch.Tensor  # the parameters every rank starts from
    grads: list[torch.Tensor]  # each rank's gradient, as it came
    params: list[torch.Tensor]  # each rank's parameters after the step
    updates: list[ShardAdamW]
    made: list[list[str]]
    errors: dict[int, BaseException] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.params)


def simulate(fn: Any, n: int = RANKS) -> Simulation:
    """Run `fn` for n ranks on threads, one step, from random parameters and a random gradient per rank."""
    g = torch.Generator().manual_seed(0)
    start = torch.randn(n * PER_RANK, generator=g)
    grads = [torch.randn(n * PER_RANK, generator=g) for _ in range(n)]
    group = SimGroup(
        n=n,
        barrier=threading.Barrier(n, timeout=WAIT_S),
        slots=[None] * n,
        made=[[] for _ in range(n)],
    )
    sim = Simulation(
        start=start,
        grads=grads,
        params=[start.clone() for _ in range(n)],
        updates=[ShardAdamW(keep=True) for _ in range(n)],
        made=group.made,
    )

    def rank_main(r: int) -> None:
        fn(sim.params[r], grads[r].clone(), SimDP(rank=r, size=n, group=group), sim.updates[r])

    # a rank that raised aborts the barrier: the others stop waiting for it
    sim.errors = run_ranks(rank_main, n, on_error=lambda _r: group.barrier.abort())
    group.barrier.abort()  # a rank still running meets no one
    return sim


def where_in(start: torch.Tensor, values: torch.Tensor) -> int | None:
    """Where the run `values` starts in `start` (random: a run of it is found at one offset only), or None."""
    m = values.numel()
    if m == 0 or m > start.numel():
        return None
    hits = (start.unfold(0, m, 1) == values.reshape(1, -1)).all(1).nonzero()
    return int(hits[0]) if len(hits) else None


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-6))


def diagnose(sim: Simulation, fn: Any) -> str | None:
    """What is wrong with one simulated step, in a learner's words; None when every rank holds what one
    process's AdamW step on the averaged gradient gives."""
    n, size, per = sim.n, sim.start.numel(), PER_RANK
    ended = stopped(sim.errors)
    if ended is not None:
        return ended
    plain = {r: e for r, e in sim.errors.items() if not isinstance(e, Deadlock | Mismatch)}
    if plain:
        r, e = min(plain.items())
        return f"rank {r} raised {raised(e, fn)}"
    mismatch = [e for e in sim.errors.values() if isinstance(e, Mismatch)]
    if mismatch:
        return f"{mismatch[0]}: every rank must call the same collectives in the same order"
    if sim.errors:
        calls = "; ".join(f"rank {r}: {', '.join(ops) or 'none'}" for r, ops in enumerate(sim.made))
        return (
            f"deadlock: {min(sim.errors.values(), key=str)}, and not every rank came ({calls}). Every rank "
            "calls the same collectives: one reduce-scatter of the gradients, one all-gather of the parameters"
        )
    average = torch.stack(sim.grads).mean(0)
    for r, update in enumerate(sim.updates):
        if len(update.calls) != 1:
            return (
                f"rank {r} called update {len(update.calls)} times in one step: call it once, with this rank's "
                "shard of the parameters and its gradients"
            )
        params, grads = update.calls[0]
        at = where_in(sim.start, params)
        if at is None:
            return (
                f"rank {r} gave update {params.numel()} values that are not a run of flat_params as the step "
                "started: give it this rank's slice (a view, or a copy that you all-gather from)"
            )
        owned = (r * per, (r + 1) * per)
        if params.numel() != size and (at, at + params.numel()) != owned:
            return (
                f"rank {r} updated elements [{at}, {at + params.numel()}) (slice {at // per}) but owns elements "
                f"[{owned[0]}, {owned[1]}) (slice {r}): the reduce-scatter leaves rank r the sum of the r-th "
                f"1/n of the buffer, n = {n} slices of {per} values in rank order — update that one"
            )
        want = average[at : at + params.numel()]
        if close(grads, n * want):
            return (
                f"your update used the sum of the ranks' gradients, {n}× one process's (rank {r}, elements "
                f"[{at}, {at + params.numel()})): the reduce-scatter sums, and one process's gradient is "
                "their mean — divide by dp.size"
            )
        if close(grads, sim.grads[r][at : at + params.numel()]):
            return (
                f"rank {r} updated with its own gradient only: each rank's gradient is of its part of the "
                "batch; reduce-scatter them so that rank r receives the sum of its slice"
            )
        if not close(grads, want):
            off = float((grads - want).abs().max())
            return (
                f"rank {r} gave update gradients for elements [{at}, {at + params.numel()}) that differ from "
                f"the ranks' average there by up to {off:.3g}"
            )
    expected = sim.start.clone()
    ShardAdamW()(expected, average)
    for r, p in enumerate(sim.params):
        wrong = ~torch.isclose(p, expected, rtol=1e-5, atol=1e-6)
        if wrong.any():
            outside = int(wrong.sum()) - int(wrong[r * per : (r + 1) * per].sum())
            stale = bool(torch.equal(p[wrong], sim.start[wrong]))
            if stale and outside == int(wrong.sum()):
                return (
                    f"after your step the ranks' parameters differ: rank {r} holds {outside} of {size} values "
                    f"as they were before the step, all outside its own slice [{r * per}, {(r + 1) * per}). "
                    "Each rank updated only its shard: all-gather the shards into flat_params so that every "
                    "rank holds the whole update"
                )
            return (
                f"after your step rank {r}'s parameters differ from one process's AdamW step in "
                f"{int(wrong.sum())} of {size} values"
            )
    return None
