"""fp32 main gradients for a 16-bit model (Megatron-LM's `main_grad`; Micikevicius et al. 2018 keep
the master copy in fp32 for the same reason: small updates vanish in 16 bits).

Autograd gives a bf16/fp16 parameter a 16-bit `.grad`. With main gradients, each parameter also owns
an fp32 `main_grad` — a view into an fp32 flat bucket — and a hook, right after each backward has
accumulated into `.grad`, adds it into `main_grad` and frees the 16-bit copy:

    backward of microbatch k ──▶ p.grad (16-bit, one parameter at a time) ──add──▶ p.main_grad (fp32)
                                                                        p.grad = None
    after the last microbatch: the fp32 buckets are all-reduced over dp (4 bytes per value, twice the
    16-bit wire bytes) and become the fp32 master weights' gradients directly — no copy at the update.

Memory: the gradient category is 4Ψ instead of 2Ψ (Megatron's 18 bytes per parameter instead of the
ZeRO paper's 16), but the update needs no 4Ψ fp32 copy of the gradients — which 16-bit reduction
makes after backward. Peak: 18Ψ + activations against 16Ψ + max(activations, 4Ψ). What main
gradients buy is accuracy: accumulation over microbatches and the dp sum keep fp32's 24-bit mantissa.
`grad_reduce_dtype` chooses (`RunConfig`).

`grad_of(p)` is the gradient every reader (the all-reduce, the TP partial sums, the overflow check,
the norm) must use: `main_grad` where there is one, else `.grad`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from workbench.parallel.flat import views


def uses_main_grads(params: Sequence[nn.Parameter], grad_dtype: torch.dtype | None) -> bool:
    """Whether gradients should live in a dtype other than the parameters' own."""
    return grad_dtype is not None and bool(params) and params[0].dtype != grad_dtype


def main_grads_as_views(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Give each parameter a `main_grad`, the slice of the fp32 buffer `flat` shaped like it."""
    for p, view in zip(params, views(flat, params), strict=True):
        p.main_grad = view


def accumulate_main_grad(p: nn.Parameter) -> None:
    """A post-accumulate-grad hook's first act: add the 16-bit gradient into the fp32 one and free it."""
    if p.grad is not None and hasattr(p, "main_grad"):
        p.main_grad.add_(p.grad)
        p.grad = None


def grad_of(p: nn.Parameter) -> torch.Tensor | None:
    """The gradient to reduce, check and step with: the fp32 main gradient, or `.grad`."""
    main = getattr(p, "main_grad", None)
    return p.grad if main is None else main
