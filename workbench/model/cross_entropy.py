"""The loss: mean cross-entropy over every token, computed in fp32 a block of rows at a time, so that no fp32
copy of the whole logits ever exists.

At GPT-2's vocabulary the logits are the largest tensor of the step: b·s·V values (16 × 1024 × 50304 is 824 M,
1.6 GB in bf16). `F.cross_entropy(logits.float(), targets)` — the usual way to take the loss in fp32 — holds
the fp32 copy (4 bytes a value) and saves its fp32 log-softmax (4 more) for backward, and backward makes two
fp32 gradients of that size (the log-softmax's and the copy's) before casting to the logits' dtype. Here:

    forward    per block of rows: the fp32 log-sum-exp of the block (a block-sized fp32 temporary); the
               target's logit is gathered; loss = mean(lse − target logit). Saved: the logits as they are
               (w bytes a value, already alive), the targets and the log-sum-exp (4 bytes a row).
    backward   per block: softmax = exp(logits − lse) in fp32, minus one at the target, × grad / N, written
               into the gradient in the logits' dtype. One gradient of the logits' size, never an fp32 one.

Measured (measure/memory.py's `loss` category, in measured steps): at its first block the backward holds the most
it will — the logits (unpacked, so no longer counted as activations, but alive until it returns), their gradient and
the block's fp32 temporaries — and reports exactly those bytes at that instant, a snapshot between two others: the
allocator's true peak of the step falls there (the start of backward, every activation still held).
`predict/formulas/activations.loss_bytes` is the same sum.

The same arithmetic as F.cross_entropy — fp32 throughout, the gradient rounded to the logits' dtype once, as the
`.float()` cast's backward rounds it — with the sums in another order: the loss agrees to about 1e-6 relative
(tests/test_models.py). The block is `BLOCK_BYTES` of fp32 (its rows: BLOCK_BYTES / (4·V)); a whole small
model's logits are one block. Liger-Kernel's and Apple's "cut cross-entropy" go further (the head's matmul
inside the loss, so the logits never exist at all); this keeps the head an ordinary layer that tensor
parallelism can split (parallel/tensor_parallel.py's vocabulary-parallel loss blocks the same way).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from workbench.measure.memory import MemoryCounter

#: fp32 bytes of one block of rows: a temporary of this size replaces the fp32 copy of the whole logits
BLOCK_BYTES = 64 * 2**20


def row_blocks(rows: int, columns: int) -> Iterator[slice]:
    """Slices of at most BLOCK_BYTES of fp32 each (at least one row)."""
    step = max(1, BLOCK_BYTES // (4 * max(1, columns)))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def report_peak(
    memory,
    logits: torch.Tensor,
    out: torch.Tensor,
    block: torch.Tensor,
    p: torch.Tensor,
) -> None:
    """To the memory tracker (if any): the loss's bytes at its peak — the logits, their gradient, the block's fp32
    copy (none for fp32 logits: `.float()` is the block itself) and its probabilities — as one snapshot."""
    if memory is None:
        return
    copy = block.numel() * 4 if logits.dtype != torch.float32 else 0
    held = (
        logits.numel() * logits.element_size()
        + out.numel() * out.element_size()
        + copy
        + p.numel() * 4
    )
    memory.add("loss", held)
    memory.snapshot()
    memory.add("loss", -held)


class _BlockedCrossEntropy(torch.autograd.Function):
    # (N, V) logits of any float dtype, (N,) int64 targets
    @staticmethod
    def forward(ctx, logits, targets, memory):
        lse = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        for rows in row_blocks(*logits.shape):
            lse[rows] = torch.logsumexp(logits[rows].float(), dim=-1)
        target_logit = logits.gather(1, targets.unsqueeze(1)).squeeze(1).float()
        ctx.save_for_backward(logits, targets, lse)
        ctx.memory = memory
        return (lse - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, targets, lse = ctx.saved_tensors
        return blocked_gradient(logits, lse, targets, grad, memory=ctx.memory), None, None


def blocked_gradient(
    logits: torch.Tensor,
    lse: torch.Tensor,
    targets: torch.Tensor,
    grad: torch.Tensor,
    *,
    memory,
    at_target: torch.Tensor | None = None,
) -> torch.Tensor:
    """d(mean loss)/d(logits) a block of rows at a time: softmax = exp(logits − lse) in fp32, minus `at_target` at
    each row's target (1; the vocabulary-parallel loss: 0 where the target is another rank's), × grad / N, written
    in the logits' dtype; the first block reports the loss's peak to `memory`."""
    out = torch.empty_like(logits)
    scale = grad / logits.size(0)
    for i, rows in enumerate(row_blocks(*logits.shape)):
        block = logits[rows].float()
        p = (block - lse[rows].unsqueeze(1)).exp_()
        if i == 0:
            report_peak(memory, logits, out, block, p)
        del block
        minus = (
            p.new_full((p.size(0), 1), -1.0)
            if at_target is None
            else -at_target[rows].unsqueeze(1).float()
        )
        p.scatter_add_(1, targets[rows].unsqueeze(1), minus)
        out[rows] = p.mul_(scale)  # the copy rounds to the logits' dtype
    return out


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, memory=None) -> torch.Tensor:
    """Mean cross-entropy over every token of (..., V) logits in fp32, without an fp32 copy of them; `memory`: the
    rank's tracker, told the loss's bytes at their peak."""
    return _BlockedCrossEntropy.apply(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), memory
    )


class CrossEntropy(nn.Module):
    """The model's loss module (tensor parallelism swaps in the vocabulary-parallel one, which takes over its
    `memory`): the rank's memory tracker (measure/memory.py), told the loss's bytes at their peak."""

    def __init__(self, memory: MemoryCounter | None = None) -> None:
        super().__init__()
        self.memory = memory

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets, self.memory)
