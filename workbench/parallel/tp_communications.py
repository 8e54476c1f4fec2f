"""The communication operators of tensor and sequence parallelism, as autograd functions
(Megatron-LM: Shoeybi et al. 2019, arXiv 1909.08053, §3; Korthikanti et al. 2022, arXiv 2205.05198, §4.2).

Each is a pair of conjugate operations, one in forward and the other in backward:

    name                        forward                         backward
    copy_to_tp        ("f")     identity                        all-reduce (sum) over tp
    reduce_from_tp    ("g")     all-reduce (sum) over tp        identity
    gather_from_seq   ("ḡ")     all-gather along the sequence   reduce-scatter along the sequence
    reduce_scatter_to_seq (ḡ*)  reduce-scatter along sequence   all-gather along the sequence
    split_to_seq                keep this rank's sequence slice all-gather along the sequence

Tensors are (batch, sequence, hidden); "along the sequence" means dim 1 is cut into tp equal slices,
slice j on tp rank j. Every collective goes through the traced Communicator with group `tp`, the
layer it serves and the direction (forward or backward) in its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.comm.traced import Communicator


@dataclass(kw_only=True)
class TPContext:
    """What a tensor-parallel layer needs: the traced communicator, this rank's index in its tp group,
    the group size, and whether sequence parallelism is on."""

    comm: Communicator
    rank: int
    size: int
    sequence_parallel: bool = False


def _meta(layer: str, direction: str) -> dict[str, Any]:
    return {"layer": layer, "direction": direction}


def all_reduce_tp(x: torch.Tensor, tp: TPContext, layer: str, direction: str) -> torch.Tensor:
    out = x.contiguous().clone()
    tp.comm.all_reduce(out, "tp", label=f"{layer} {direction}", meta=_meta(layer, direction))
    return out


def gather_seq(x: torch.Tensor, tp: TPContext, layer: str, direction: str) -> torch.Tensor:
    """(b, s/t, ...) on each rank → (b, s, ...) on every rank."""
    b, s_local, *rest = x.shape
    out = torch.empty(tp.size, b, s_local, *rest, dtype=x.dtype, device=x.device)
    tp.comm.all_gather(
        out, x.contiguous(), "tp", label=f"{layer} {direction}", meta=_meta(layer, direction)
    )
    return out.transpose(0, 1).reshape(b, tp.size * s_local, *rest)


def reduce_scatter_seq(x: torch.Tensor, tp: TPContext, layer: str, direction: str) -> torch.Tensor:
    """(b, s, ...) partial sums on each rank → (b, s/t, ...) summed slice on rank j."""
    b, s, *rest = x.shape
    chunks = x.reshape(b, tp.size, s // tp.size, *rest).transpose(0, 1).contiguous()
    out = torch.empty(b, s // tp.size, *rest, dtype=x.dtype, device=x.device)
    tp.comm.reduce_scatter(
        out, chunks, "tp", label=f"{layer} {direction}", meta=_meta(layer, direction)
    )
    return out


def seq_slice(x: torch.Tensor, tp: TPContext) -> torch.Tensor:
    s_local = x.size(1) // tp.size
    return x[:, tp.rank * s_local : (tp.rank + 1) * s_local].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp, layer):
        ctx.tp, ctx.layer = tp, layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_tp(grad, ctx.tp, ctx.layer, "backward"), None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp, layer):
        return all_reduce_tp(x, tp, layer, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GatherFromSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp, layer):
        ctx.tp, ctx.layer = tp, layer
        return gather_seq(x, tp, layer, "forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_seq(grad, ctx.tp, ctx.layer, "backward"), None, None


class _ReduceScatterToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp, layer):
        ctx.tp, ctx.layer = tp, layer
        return reduce_scatter_seq(x, tp, layer, "forward")

    @staticmethod
    def backward(ctx, grad):
        return gather_seq(grad, ctx.tp, ctx.layer, "backward"), None, None


class _SplitToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tp, layer):
        ctx.tp, ctx.layer = tp, layer
        return seq_slice(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return gather_seq(grad, ctx.tp, ctx.layer, "backward"), None, None


def copy_to_tp(x: torch.Tensor, tp: TPContext, layer: str) -> torch.Tensor:
    """f: identity forward, all-reduce backward (before a column-parallel layer)."""
    return _CopyToTP.apply(x, tp, layer)


def reduce_from_tp(x: torch.Tensor, tp: TPContext, layer: str) -> torch.Tensor:
    """g: all-reduce forward, identity backward (after a row-parallel layer)."""
    return _ReduceFromTP.apply(x, tp, layer)


def gather_from_seq(x: torch.Tensor, tp: TPContext, layer: str) -> torch.Tensor:
    """Sequence parallel's ḡ: all-gather forward, reduce-scatter backward."""
    return _GatherFromSeq.apply(x, tp, layer)


def reduce_scatter_to_seq(x: torch.Tensor, tp: TPContext, layer: str) -> torch.Tensor:
    """Sequence parallel's replacement of g: reduce-scatter forward, all-gather backward."""
    return _ReduceScatterToSeq.apply(x, tp, layer)


def split_to_seq(x: torch.Tensor, tp: TPContext, layer: str) -> torch.Tensor:
    """Keep this rank's slice of the sequence; all-gather the gradient in backward."""
    return _SplitToSeq.apply(x, tp, layer)
