"""Activation recomputation (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
selective recomputation: Korthikanti et al. 2022, §5).

    full        each transformer block keeps only its input; in backward the block's forward runs
                again (a `recompute` span in the trace) and its backward follows at once.
    selective   only the attention core — scores, softmax, weighted sum — is recomputed: the a·s²·b
                term of the activations (the softmax probabilities) is never kept.

`apply_recompute(model, rc)` turns it on for a built GPT (or pipeline stage): full sets each
block's `recompute`, selective each attention's. `Recompute.run(name, fn, *inputs)` is the mechanism:
an autograd function that runs `fn` without keeping its intermediate tensors, saves `inputs`, and in
backward reruns `fn` with gradients on and back-propagates through it. The bytes the rerun saves are
counted as activations while they live, so the memory counters show the one layer being recomputed on
top of the saved inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from workbench.measure.memory import MemoryTracker
from workbench.model.gpt import Block, CausalSelfAttention
from workbench.trace.recorder import TraceRecorder


@dataclass
class Recompute:
    mode: str  # "none", "selective" or "full"
    recorder: TraceRecorder | None = None
    memory: MemoryTracker | None = None

    def run(
        self, name: str, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor
    ) -> torch.Tensor:
        return _Recompute.apply(self, name, fn, *inputs)


def apply_recompute(model: nn.Module, rc: Recompute) -> nn.Module:
    """Full: every block keeps only its input. Selective: every attention keeps only q, k, v."""
    target = Block if rc.mode == "full" else CausalSelfAttention
    for module in model.modules():
        if isinstance(module, target):
            module.recompute = rc
    return model


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rc, name, fn, *inputs):  # noqa: ANN001
        ctx.rc, ctx.name, ctx.fn = rc, name, fn
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        rc: Recompute = ctx.rc
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        span = (
            rc.recorder.span(f"recompute {ctx.name}", "recompute", "compute", layer=ctx.name)
            if rc.recorder is not None
            else nullcontext()
        )
        counting = rc.memory.count_saved_activations() if rc.memory is not None else nullcontext()
        with span, torch.enable_grad(), counting:  # the rerun's saves count while they live
            out = ctx.fn(*inputs)
        if rc.memory is not None:
            rc.memory.snapshot()
        torch.autograd.backward(out, grad)  # its backward releases them as it consumes them
        return (None, None, None, *[t.grad if t.requires_grad else None for t in inputs])
