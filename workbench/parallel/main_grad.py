"""fp32 main gradients for a 16-bit model (Megatron-LM's `main_grad`; Micikevicius et al. 2018 keep
the master copy in fp32 for the same reason: small updates vanish in 16 bits).

Autograd gives a bf16/fp16 parameter a 16-bit `.grad`. With main gradients, each parameter also has
an fp32 main gradient — a view into an fp32 flat bucket — and a hook, right after each backward has
accumulated into `.grad`, adds it into the main gradient and frees the 16-bit copy:

    backward of microbatch k ──▶ p.grad (16-bit, one parameter at a time) ──add──▶ main grad of p (fp32)
                                                                        p.grad = None
    after the last microbatch: the fp32 buckets are all-reduced over dp (4 bytes per value, twice the
    16-bit wire bytes) and become the fp32 master weights' gradients directly — no copy at the update.

Memory: the gradient category is 4Ψ instead of 2Ψ (Megatron's 18 bytes per parameter instead of the
ZeRO paper's 16), but the update needs no 4Ψ fp32 copy of the gradients — which 16-bit reduction
makes after backward. Peak: 18Ψ + activations against 16Ψ + max(activations, 4Ψ). What main
gradients buy is accuracy: accumulation over microbatches and the dp sum keep fp32's 24-bit mantissa.
`grad_reduce_dtype` chooses (`RunConfig`).

The main gradients are a `MainGrads`, owned by the data-parallel grad sync that holds their buffers
and handed by the strategy (engine/parallelize.py) to whoever reads a gradient: the all-reduce, the TP
partial sums (TensorParallelGrads), the overflow check and the norm (MixedPrecisionUpdater). Its
`grad_of(p)` is the gradient every reader must use: the main gradient where there is one, else `.grad`.
Nothing is stored on the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from workbench.parallel.flat import views


def uses_main_grads(params: Sequence[nn.Parameter], grad_dtype: torch.dtype | None) -> bool:
    """Whether gradients should live in a dtype other than the parameters' own."""
    return grad_dtype is not None and bool(params) and params[0].dtype != grad_dtype


class MainGrads:
    """The fp32 main gradient of each 16-bit parameter that has one, by parameter (by identity). Empty for a
    model whose gradients are its own `.grad` (fp32, or 16-bit reduction)."""

    def __init__(self) -> None:
        self._main: dict[int, torch.Tensor] = {}

    def allocate(self, params: Sequence[nn.Parameter], dtype: torch.dtype) -> None:
        """A zeroed main gradient of `dtype` for each parameter, each its own tensor."""
        for p in params:
            self._main[id(p)] = torch.zeros_like(p, dtype=dtype)

    def as_views(self, params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
        """Each parameter's main gradient is the slice of the fp32 buffer `flat` shaped like it."""
        for p, view in zip(params, views(flat, params), strict=True):
            self._main[id(p)] = view

    def accumulate(self, p: nn.Parameter) -> None:
        """A post-accumulate-grad hook's first act: add the 16-bit gradient into the fp32 one and free it."""
        main = self._main.get(id(p))
        if p.grad is not None and main is not None:
            main.add_(p.grad)
            p.grad = None

    def zero_(self, params: Sequence[nn.Parameter]) -> None:
        """Zero the main gradients of `params` (those that have one)."""
        for p in params:
            main = self._main.get(id(p))
            if main is not None:
                main.zero_()

    def grad_of(self, p: nn.Parameter) -> torch.Tensor | None:
        """The gradient to reduce, check and step with: the fp32 main gradient, or `.grad`."""
        main = self._main.get(id(p))
        return p.grad if main is None else main
