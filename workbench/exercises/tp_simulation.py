"""The tensor-parallel exercise's MLP (exercises/tensor_parallel.py): its data, what one process computes, the
`tp` handle the learner's `tp_mlp` is given, and that function run on simulated ranks — a thread per rank
(exercises/simulated_ranks.py's harness), f
and g the real ones (parallel/tp_communications.py's copy_to_tp and reduce_from_tp) over a stand-in
communicator whose all-reduce sums the threads' tensors. Only the transport differs from the real ranks.

Everything is float64, so that a correct answer differs from one process by rounding alone: RTOL, relative to
the largest value of what is compared. ε = 2.2e-16, and the sharded MLP sums the same products as one process in
another order (each rank's 32 hidden units, then the two partial sums), which moves a sum of 64 terms by at most
~64·ε of its terms' size, ~1e-14; 1e-9 leaves five orders of magnitude, and every wrong answer is off by O(1) (a
missing half of the hidden units: ~50 %)."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from workbench.exercises.simulated_ranks import WAIT_S, Deadlock, TooMany, cap, run_ranks
from workbench.parallel.tp_communications import TPContext, copy_to_tp, reduce_from_tp

#: tokens, the model's width h and the tensor-parallel degree t; the MLP's hidden layer is 4h wide. Each size
#: differs from the others (12, 16, 64, 32 = 4h/t, 8 = h/t), so a shape in an error names what it is
TOKENS, HIDDEN, RANKS = 12, 16, 2
FFN = 4 * HIDDEN
#: the simulated degrees: the real run's, and another that divides 4h = 64, so that a fixed 2 in place of
#: tp.size fails (at t = 4, 4h/t = 16 = h: a shape in an error there is less telling)
SIMULATED = (RANKS, 4)
#: the all-reduces an MLP takes on a rank: g's forward and f's backward
ALL_REDUCES = 2
#: a correct answer's largest difference from one process, relative (see the module's docstring)
RTOL = 1e-9


@dataclass(frozen=True, kw_only=True)
class MLPData:
    """The input x [tokens, h] (the same on every rank), the full weights in nn.Linear's layout — w1 [4h, h],
    w2 [h, 4h] — and the target of the loss ½·Σ(y − target)² / tokens."""

    x: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    target: torch.Tensor


def data() -> MLPData:
    """The same values on every rank and in every check (seeded); weights scaled so activations are O(1)."""
    gen = torch.Generator().manual_seed(53)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return MLPData(
        x=randn(TOKENS, HIDDEN),
        w1=randn(FFN, HIDDEN) / math.sqrt(HIDDEN),
        w2=randn(HIDDEN, FFN) / math.sqrt(FFN),
        target=randn(TOKENS, HIDDEN),
    )


def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Fresh copies that collect gradients (what the learner's function is handed)."""
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def loss_of(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((y - target) ** 2).sum() / TOKENS


def close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    """a equals b within RTOL of b's largest value."""
    return a is not None and float((a - b).abs().max()) <= RTOL * float(b.abs().max())


def mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The MLP as one process runs it: GELU(x·w1ᵀ)·w2ᵀ."""
    return F.linear(F.gelu(F.linear(x, w1)), w2)


@dataclass(kw_only=True)
class Found:
    """What one rank (or one process) computed: the output and the gradients of x, w1 and w2."""

    y: torch.Tensor
    x_grad: torch.Tensor | None
    w1_grad: torch.Tensor | None
    w2_grad: torch.Tensor | None


def one_process(d: MLPData, w1: torch.Tensor, w2: torch.Tensor) -> Found:
    """The whole MLP in one process, on weights w1 and w2, and its gradients."""
    x, w1, w2 = leaves(d.x, w1, w2)
    y = mlp(x, w1, w2)
    loss_of(y, d.target).backward()
    return Found(y=y.detach(), x_grad=x.grad, w1_grad=w1.grad, w2_grad=w2.grad)


def partial(
    d: MLPData, units: list[int], grad_y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a rank holding only the hidden units `units` computes with no communication: its partial output
    GELU(x·w1[units]ᵀ)·w2[:, units]ᵀ, and x's gradient through those units for the output's gradient grad_y."""
    (x,) = leaves(d.x)
    y = mlp(x, d.w1[units], d.w2[:, units])
    y.backward(grad_y)
    assert x.grad is not None
    return y.detach(), x.grad


class TP:
    """What `tp_mlp` gets as `tp`: this rank's index `rank` in the tensor-parallel group and its size `size`,
    and Megatron's two conjugate operators on the group (Shoeybi et al. 2019, §3):
    `f(t)` — identity forward, all-reduce (sum) of t's gradient backward;
    `g(t)` — all-reduce (sum) forward, identity backward."""

    def __init__(self, context: TPContext) -> None:
        self.context = context
        self.rank, self.size = context.rank, context.size

    def f(self, t: torch.Tensor) -> torch.Tensor:
        return copy_to_tp(t, self.context, "f")

    def g(self, t: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(t, self.context, "g")


@dataclass(frozen=True, kw_only=True)
class Call:
    """One all-reduce a simulated rank made: its index k on that rank, whose it is (f's backward, g's
    forward: the traced communicator's label) and the shape."""

    rank: int
    k: int
    label: str
    shape: tuple[int, ...]


class Mismatch(Exception):
    """The ranks met at an all-reduce with different operations or shapes (NCCL would sum garbage or hang)."""

    def __init__(self, calls: list[Call]) -> None:
        super().__init__(", ".join(f"rank {c.rank}: {c.label} {list(c.shape)}" for c in calls))
        self.calls = calls


class BadOutput(Exception):
    """tp_mlp returned something that is not the MLP's [tokens, h] output."""


class SimGroup:
    """The simulated ranks' shared state: a barrier per all-reduce, a slot per rank, each rank's calls."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=WAIT_S)
        self.slots: list[Any] = [None] * n
        self.calls: list[list[Call]] = [[] for _ in range(n)]


class SimComm:
    """Stands in for the traced communicator (comm/traced.py) where f and g use it: `all_reduce(tensor, group,
    label=, meta=)` sums `tensor` in place over the simulated ranks."""

    def __init__(self, group: SimGroup, rank: int) -> None:
        self.group, self.rank = group, rank

    def all_reduce(self, tensor: torch.Tensor, group: str = "tp", **kw: Any) -> None:
        g = self.group
        label = str(kw.get("label") or "all_reduce")
        if len(g.calls[self.rank]) >= cap(ALL_REDUCES):
            raise TooMany(
                rank=self.rank,
                expected=f"{ALL_REDUCES} all-reduces (g forward, f backward)",
                what="in one forward and backward",
                cap=len(g.calls[self.rank]),
            )
        call = Call(
            rank=self.rank, k=len(g.calls[self.rank]), label=label, shape=tuple(tensor.shape)
        )
        g.calls[self.rank].append(call)
        g.slots[self.rank] = (call, tensor.detach().clone())
        self._wait(call)
        met = list(g.slots)
        if any(c.label != call.label or c.shape != call.shape for c, _ in met):
            raise Mismatch([c for c, _ in met])
        total = sum(t for _, t in met)
        self._wait(call)  # every rank has read the slots before any writes its next
        tensor.copy_(total)

    def _wait(self, call: Call) -> None:
        try:
            self.group.barrier.wait()
        except threading.BrokenBarrierError:
            raise Deadlock(
                rank=call.rank, k=call.k, what=f"all-reduce ({call.label})", detail=call
            ) from None


@dataclass(kw_only=True)
class Simulation:
    data: MLPData
    found: list[Found | None]
    errors: dict[int, BaseException]
    calls: list[list[Call]]

    @property
    def n(self) -> int:
        return len(self.found)


def check_output(y: Any) -> torch.Tensor:
    if not isinstance(y, torch.Tensor):
        raise BadOutput(
            f"tp_mlp returned {type(y).__name__}; it returns the MLP's output, a tensor [tokens, h]"
        )
    if tuple(y.shape) != (TOKENS, HIDDEN):
        raise BadOutput(
            f"tp_mlp returned a tensor of shape {list(y.shape)}; the MLP's output is [tokens, h] = "
            f"{[TOKENS, HIDDEN]} on every rank"
        )
    if not y.requires_grad:
        raise BadOutput(
            "tp_mlp's output does not depend on x, w1 or w2 through autograd (a .detach(), .data or "
            "torch.no_grad() cut it): backward could not reach them"
        )
    return y


def simulate(fn: Any, n: int = RANKS) -> Simulation:
    """Run `fn` on n ranks in threads: forward, the loss, backward; what each rank computed and called."""
    d = data()
    group = SimGroup(n)
    found: list[Found | None] = [None] * n

    def rank_main(r: int) -> None:
        comm = cast(Any, SimComm(group, r))
        tp = TP(TPContext(comm=comm, rank=r, size=n))
        x, w1, w2 = leaves(d.x, d.w1, d.w2)
        y = check_output(fn(x, w1, w2, tp))
        loss_of(y, d.target).backward()
        found[r] = Found(y=y.detach(), x_grad=x.grad, w1_grad=w1.grad, w2_grad=w2.grad)

    # a rank that raised aborts the barrier: the others stop waiting for it
    errors = run_ranks(rank_main, n, on_error=lambda _r: group.barrier.abort())
    group.barrier.abort()  # a rank still running meets no one
    return Simulation(data=d, found=found, errors=errors, calls=group.calls)
