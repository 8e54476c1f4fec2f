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

#: fp32 bytes of one block of rows: a temporary of this size replaces the fp32 copy of the whole logits
BLOCK_BYTES = 64 * 2**20


def row_blocks(rows: int, columns: int) -> Iterator[slice]:
    """Slices of at most BLOCK_BYTES of fp32 each (at least one row)."""
    step = max(1, BLOCK_BYTES // (4 * max(1, columns)))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


class _BlockedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):  # noqa: ANN001 - (N, V) logits of any float dtype, (N,) int64 targets
        lse = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        for rows in row_blocks(*logits.shape):
            lse[rows] = torch.logsumexp(logits[rows].float(), dim=-1)
        target_logit = logits.gather(1, targets.unsqueeze(1)).squeeze(1).float()
        ctx.save_for_backward(logits, targets, lse)
        return (lse - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        scale = grad / logits.size(0)
        for rows in row_blocks(*logits.shape):
            p = (logits[rows].float() - lse[rows].unsqueeze(1)).exp_()
            p.scatter_add_(1, targets[rows].unsqueeze(1), p.new_full((p.size(0), 1), -1.0))
            out[rows] = p.mul_(scale)  # the copy rounds to the logits' dtype
        return out, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every token of (..., V) logits in fp32, without an fp32 copy of them."""
    return _BlockedCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class CrossEntropy(nn.Module):
    """The model's loss module (tensor parallelism swaps in the vocabulary-parallel one)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, targets)
