"""Activation recomputation (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost";
selective recomputation: Korthikanti et al. 2022, §5).

    full        each transformer block keeps only its input; in backward the block's forward runs
                again (a `recompute` span in the trace) and its backward follows at once.
    selective   only the attention core — scores, softmax, weighted sum — is recomputed: the a·s²·b
                term of the activations (the softmax probabilities) is never kept.

The model is built with it (`ModelWiring.recompute`, engine/parallelize.py): full gives it to each
block, selective to each attention. `Recompute.run(name, fn, *inputs)` is the mechanism:
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

from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.trace.recorder import TraceRecorder


@dataclass(kw_only=True)
class Recompute:
    """What reruns (`mode`), and who records it: the recorder (a `recompute` span) and the memory tracker
    (the rerun's saves counted as activations while they live)."""

    mode: str  # "none", "selective" or "full"
    recorder: TraceRecorder | None = None
    memory: MemoryCounter = NO_MEMORY

    def run(
        self, name: str, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor
    ) -> torch.Tensor:
        return _Recompute.apply(self, name, fn, *inputs)


class _Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rc, name, fn, *inputs):
        ctx.rc, ctx.name, ctx.fn = rc, name, fn
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(*inputs)

    @staticmethod
    def backward(ctx, grad):
        rc: Recompute = ctx.rc
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in ctx.saved_tensors]
        span = (
            rc.recorder.span(f"recompute {ctx.name}", "recompute", "compute", layer=ctx.name)
            if rc.recorder is not None
            else nullcontext()
        )
        with span, torch.enable_grad(), rc.memory.count_saved_activations():
            out = ctx.fn(*inputs)  # the rerun's saves count while they live
        rc.memory.snapshot()
        torch.autograd.backward(out, grad)  # its backward releases them as it consumes them
        return (None, None, None, *[t.grad if t.requires_grad else None for t in inputs])
