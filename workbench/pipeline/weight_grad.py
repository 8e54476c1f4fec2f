"""The backward split in two (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2): I computes the
gradient of a stage's input — what the previous stage is waiting for — and W the gradients of its
weights, which nobody waits for, so a schedule can run W later, in what would be a bubble.

For a Linear layer y = x·Wᵀ + b with output gradient dy:

    I   dx = dy · W                      (needs W, which stays on the rank anyway)
    W   dW = dyᵀ · x,  db = Σ dy         (needs x and dy: kept from I until W runs — the "stash")

So a microbatch whose backward the schedule splits runs its forward through `_SplitLinear`, given the
weights *detached* (no edge to their gradient accumulators: a Function that returns no gradient for a
parameter still fires its post-accumulate hooks, which the data-parallel buckets count); its backward
(I) returns dx and stashes (x, dy); W then computes dW and db exactly as autograd would have, inside one
autograd pass whose node feeds the parameters' accumulators (`_StashedWeightGrads`), so every gradient
hook — fp32 main gradients, the data-parallel buckets — fires once, as after a full backward, and each
gradient is taken as it comes, not copied (a gradient handed in from Python, still referenced there, is
copied at its first accumulation: W cost ~10 % more that way, one engine call per Linear).
A microbatch run as B uses F.linear unchanged. Parameters that are not a Linear's (layer norms, the
embeddings) get their gradients in I: they are small, and Megatron's zero-bubble implementation does
the same. Under sequence parallelism the column-parallel layers (their own autograd function) compute
their weight gradients in I too.

The stash is counted in memory's `wgrad_stash` category: per pending (stage, microbatch), each
Linear's input and output gradient (docs/formulas.md, "Zero-bubble pipelines").

Nothing is communicated here: the gradient collectives stay where the gradient sync puts them (after
the last W of a stage, when the buckets are complete).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from workbench.measure.memory import NO_MEMORY, MemoryCounter

Key = tuple[int, int]  # (stage, microbatch)


class WeightGradStore:
    """The (x, dy) pairs each I left for its W, by (stage, microbatch)."""

    def __init__(self, memory: MemoryCounter = NO_MEMORY) -> None:
        self.memory = memory
        self.stash: dict[
            Key, list[tuple[nn.Parameter, nn.Parameter | None, torch.Tensor, torch.Tensor]]
        ] = {}
        # where the Linear backwards running now stash (None: not split)
        self._into: list | None = None
        # the forward running now belongs to a microbatch whose backward is split
        self.split_forward = False

    @contextmanager
    def forward(self, split: bool) -> Iterator[None]:
        """Inside: the forward of a microbatch whose backward will be I then W (split) or B."""
        before, self.split_forward = self.split_forward, split
        try:
            yield
        finally:
            self.split_forward = before

    @contextmanager
    def input_grad(self, key: Key) -> Iterator[None]:
        """Inside: autograd's backward is an I — each Linear stashes instead of computing dW."""
        self._into = self.stash.setdefault(key, [])
        try:
            yield
        finally:
            self._into = None

    @property
    def splitting(self) -> bool:
        return self._into is not None

    def put(
        self, weight: nn.Parameter, bias: nn.Parameter | None, x: torch.Tensor, dy: torch.Tensor
    ) -> None:
        assert self._into is not None
        self._into.append((weight, bias, x, dy))
        self.memory.add("wgrad_stash", _nbytes(x) + _nbytes(dy))

    def weight_grad(self, key: Key) -> None:
        """W of (stage, microbatch): each stashed Linear's dW (and db), accumulated through autograd —
        one autograd pass for all of them (`_StashedWeightGrads`)."""
        entries = self.stash.pop(key, [])
        if entries:
            params = [p for w, b, _, _ in entries for p in ((w,) if b is None else (w, b))]
            torch.autograd.backward(_StashedWeightGrads.apply(self, entries, *params))

    def pending(self) -> list[Key]:
        return sorted(k for k, v in self.stash.items() if v)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _weight_grads(
    x: torch.Tensor, dy: torch.Tensor, bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dW = dyᵀ·x and db = Σ dy over every token (what F.linear's backward computes)."""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    return dy2.t().mm(x2), (dy2.sum(0) if bias else None)


class _StashedWeightGrads(torch.autograd.Function):
    """W as one autograd pass: a node whose inputs are the stashed Linears' parameters and whose backward
    computes their dW (and db) from the stash, releasing each Linear's (x, dy) from the count as it goes.
    Autograd's accumulation then takes each gradient as it comes (nothing else holds it: the first
    microbatch's is kept, not copied, as a full backward's is) and fires every parameter's hooks once —
    one engine call per W instead of one per Linear, each of which copied its first gradients."""

    @staticmethod
    def forward(
        ctx: Any, store: WeightGradStore, entries: list, *params: torch.Tensor
    ) -> torch.Tensor:
        ctx.store, ctx.entries = store, entries
        return torch.zeros(())

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads: list[torch.Tensor | None] = []
        for _w, bias, x, dy in ctx.entries:
            dw, db = _weight_grads(x, dy, bias is not None)
            grads += [dw] if bias is None else [dw, db]
            ctx.store.memory.add("wgrad_stash", -(_nbytes(x) + _nbytes(dy)))
        ctx.entries = None  # the stash goes now, not with the graph
        return (None, None, *grads)


@dataclass
class _Params:
    """The Linear's parameters, handed to `_SplitLinear` inside an object so that autograd draws no edge
    to them; kept as themselves (an unpacked save of a leaf can be another tensor object on its storage,
    and W must accumulate into the parameter and fire its hooks)."""

    weight: torch.Tensor
    bias: torch.Tensor | None


class _SplitLinear(torch.autograd.Function):
    """F.linear of detached weights whose backward (inside `WeightGradStore.input_grad`) returns only dx
    and stashes (x, dy) for W."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, params: _Params, store: WeightGradStore) -> torch.Tensor:
        ctx.save_for_backward(x)  # an activation (measure/memory.py counts it as one)
        ctx.params, ctx.store = params, store
        bias = params.bias.detach() if params.bias is not None else None
        return F.linear(x, params.weight.detach(), bias)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,), p = ctx.saved_tensors, ctx.params
        dx = dy.matmul(p.weight.detach()) if ctx.needs_input_grad[0] else None
        if ctx.store.splitting:
            ctx.store.put(p.weight, p.bias, x, dy)
        else:  # a split forward met a full backward: the weights' gradients now (what B does)
            dw, db = _weight_grads(x, dy, p.bias is not None)
            leaves, grads = (
                ([p.weight, p.bias], [dw, db]) if p.bias is not None else ([p.weight], [dw])
            )
            torch.autograd.backward(leaves, grads)
        return dx, None, None


def split_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    store: WeightGradStore,
) -> torch.Tensor:
    """F.linear, through `_SplitLinear` while a split microbatch's forward (or its I) runs."""
    if store.split_forward or store.splitting:
        return _SplitLinear.apply(x, _Params(weight, bias), store)
    return F.linear(x, weight, bias)


def _linear_forward(m: nn.Linear, store: WeightGradStore, x: torch.Tensor) -> torch.Tensor:
    return split_linear(x, m.weight, m.bias, store=store)


@runtime_checkable
class RoutedLinear(Protocol):
    """A layer whose matmul is its `linear` attribute: tensor parallelism's (parallel/tensor_parallel.py)."""

    linear: Callable[..., torch.Tensor]


def split_linears(module: nn.Module, store: WeightGradStore) -> int:
    """Route every Linear of `module` through `_SplitLinear`: nn.Linear by its forward, the tensor-parallel
    layers by their `linear` (parallel/tensor_parallel.py). Returns how many were routed."""
    n = 0
    for m in module.modules():
        # its parameters looked up at each call (a cast may replace them)
        if isinstance(m, nn.Linear):
            # on purpose: this instance's forward shadows nn.Linear's (Module.__call__ finds it first),
            # an assignment mypy refuses on a method
            m.forward = partial(_linear_forward, m, store)  # type: ignore[method-assign]
            n += 1
        elif isinstance(m, RoutedLinear):
            m.linear = partial(split_linear, store=store)
            n += 1
    return n
