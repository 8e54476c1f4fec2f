"""Megatron-style tensor parallelism (Shoeybi et al. 2019, arXiv 1909.08053) with sequence
parallelism (Korthikanti et al. 2022, arXiv 2205.05198). t = tensor-parallel degree, j = tp rank.

ColumnParallelLinear — Y = X·Aᵀ with A (out × in) split by output rows, A = [A_1; …; A_t]:

        X ──f──▶ X·A_jᵀ = Y_j          rank j holds A_j (out/t × in) and b_j; Y stays split on its last dim
        f: identity forward, all-reduce of dL/dX backward
        with sequence parallelism, f becomes an all-gather of X along the sequence (forward) and a
        reduce-scatter of dL/dX (backward); only X's slice is saved, X is gathered again in backward.

RowParallelLinear — Y = X·Aᵀ with A split by input columns, X arriving split on its last dim:

        X_j ──▶ X_j·A_jᵀ (partial) ──g──▶ Y + b      rank j holds A_j (out × in/t); b is replicated
        g: all-reduce forward, identity backward; with sequence parallelism a reduce-scatter along the
        sequence forward and an all-gather backward.

Attention: the qkv projection is column-parallel by heads (rank j owns heads j·a/t … (j+1)·a/t − 1 of
q, and K/V heads j·g/t … (j+1)·g/t − 1 of k and v: with grouped-query attention's g = kv_heads < a the
query heads a rank holds are exactly those its K/V heads serve, so t must divide g — Megatron-LM's rule;
config/model_config.check_tensor_parallel refuses another t), the output projection row-parallel. MLP: fc
column-parallel (SwiGLU's gate and up, fused, each split), proj row-parallel. So one
block costs two all-reduces in forward and two in backward (or, with sequence parallelism, two
all-gathers and two reduce-scatters each way — the same bytes, and the layer norms' activations are
split t ways).

VocabParallelEmbedding splits the embedding by vocabulary rows; each rank looks up the tokens it owns
(zeros elsewhere) and the partial embeddings are summed (g, or reduce-scatter with sequence
parallelism). `vocab_parallel_cross_entropy` takes logits split by vocabulary and never gathers them:
three all-reduces of one number per token (max, sum of exponentials, the target's logit).

`apply_tensor_parallel(model, tp)` turns a dense GPT into this by swapping modules, as a table
(picotron's apply_tensor_parallel; the plan DTensor's parallelize_module takes). Every shard is cut from
the full deterministic initial value of its parameter (`shard_param`, `full_shapes`), one parameter at a
time, so tp=1 and tp=t start from the same model. What each parameter is under tensor parallelism — a
shard, or whole with a partial gradient — is `tensor_parallel_role(module, leaf)`, read from the module's
type: the strategy writes it into the parameters' facts (parallel/param_facts.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from workbench.measure.memory import MemoryCounter
from workbench.model.cross_entropy import CrossEntropy, blocked_gradient, row_blocks
from workbench.model.fused_linear import FusedLinear
from workbench.model.gpt import GPT
from workbench.model.llama import RMSNorm
from workbench.parallel.flat import pack, unpack
from workbench.parallel.grad_sync import SyncToggle
from workbench.parallel.main_grad import MainGrads
from workbench.parallel.param_facts import ParamTable
from workbench.parallel.tp_communications import (
    TPContext,
    all_reduce_tp,
    copy_to_tp,
    gather_seq,
    reduce_from_tp,
    reduce_scatter_seq,
    reduce_scatter_to_seq,
)


def _split_rows(
    full: torch.Tensor, tp: TPContext, sections: tuple[int, ...] | None = None
) -> torch.Tensor:
    """Rank j's share of dim 0: its t-th of each of the `sections` (q, k, v of a fused projection; gate and
    up of SwiGLU's), concatenated; all of dim 0 as one section when None."""
    parts = full.split(list(sections)) if sections else [full]
    mine = [
        part[tp.rank * (part.size(0) // tp.size) : (tp.rank + 1) * (part.size(0) // tp.size)]
        for part in parts
    ]
    return torch.cat(mine).clone()


_M = TypeVar("_M", bound=nn.Module)


class _ColumnParallelSP(torch.autograd.Function):
    """All-gather the sequence, then X·Wᵀ + b; saves only the local slice of X (sequence parallelism)."""

    @staticmethod
    def forward(ctx, x_local, weight, bias, tp, layer):  # noqa: PLR0917 - autograd's apply is positional
        ctx.tp, ctx.layer = tp, layer
        ctx.save_for_backward(x_local, weight)
        return F.linear(gather_seq(x_local, tp, layer, "forward"), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x_local, weight = ctx.saved_tensors
        x = gather_seq(x_local, ctx.tp, ctx.layer, "backward")  # gathered again instead of kept
        grad_x = grad @ weight
        grad_w = grad.reshape(-1, grad.size(-1)).t() @ x.reshape(-1, x.size(-1))
        grad_b = grad.reshape(-1, grad.size(-1)).sum(0) if ctx.needs_input_grad[2] else None
        return reduce_scatter_seq(grad_x, ctx.tp, ctx.layer, "backward"), grad_w, grad_b, None, None


class ColumnParallelLinear(nn.Module):
    # pipeline/weight_grad.py splits its backward for zero-bubble schedules
    linear = staticmethod(F.linear)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tp: TPContext,
        layer: str,
        *,
        sections: tuple[int, ...] | None = None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.tp, self.layer, self.sections = tp, layer, sections
        self.full_shapes = {"weight": (out_features, in_features), "bias": (out_features,)}
        self.weight = nn.Parameter(torch.empty(out_features // tp.size, in_features))
        self.bias = nn.Parameter(torch.empty(out_features // tp.size)) if bias else None

    def shard_param(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return _split_rows(full, self.tp, self.sections)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.sequence_parallel:
            return _ColumnParallelSP.apply(x, self.weight, self.bias, self.tp, self.layer)
        return self.linear(copy_to_tp(x, self.tp, self.layer), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    # pipeline/weight_grad.py splits its backward for zero-bubble schedules
    linear = staticmethod(F.linear)

    def __init__(
        self, in_features: int, out_features: int, tp: TPContext, layer: str, *, bias: bool = True
    ) -> None:
        super().__init__()
        self.tp, self.layer = tp, layer
        self.full_shapes = {"weight": (out_features, in_features), "bias": (out_features,)}
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp.size))
        # replicated, added after the sum; with sequence parallelism each rank adds it to its own slice of
        # the sequence: its gradient is partial and must be summed over tp (tensor_parallel_role)
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def shard_param(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        if leaf == "bias":
            return full.clone()
        per = full.size(1) // self.tp.size
        return full[:, self.tp.rank * per : (self.tp.rank + 1) * per].clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.linear(x, self.weight)
        out = (
            reduce_scatter_to_seq(partial, self.tp, self.layer)
            if self.tp.sequence_parallel
            else reduce_from_tp(partial, self.tp, self.layer)
        )
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, tp: TPContext, layer: str) -> None:
        super().__init__()
        self.tp, self.layer = tp, layer
        self.full_shapes = {"weight": (vocab_size, hidden)}
        self.per = vocab_size // tp.size
        self.start = tp.rank * self.per
        self.weight = nn.Parameter(torch.empty(self.per, hidden))

    def shard_param(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return _split_rows(full, self.tp)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        outside = (idx < self.start) | (idx >= self.start + self.per)
        local = (idx - self.start).masked_fill(outside, 0)
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.tp.sequence_parallel:
            return reduce_scatter_to_seq(partial, self.tp, self.layer)
        return reduce_from_tp(partial, self.tp, self.layer)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Blocked as model/cross_entropy.py's loss: fp32 a block of rows at a time, no fp32 copy of the logits."""

    @staticmethod
    def forward(ctx, logits, targets, tp, memory):
        n, v_local = logits.shape
        vocab_start = tp.rank * v_local  # this rank's first row of the vocabulary
        layer = "loss"
        m = logits.amax(dim=-1).float()
        tp.comm.all_reduce(
            m,
            "tp",
            label="loss max forward",
            reduce_op="max",
            meta={"layer": layer, "direction": "forward"},
        )
        local_sum = torch.empty(n, dtype=torch.float32, device=logits.device)
        for rows in row_blocks(n, v_local):
            local_sum[rows] = (logits[rows].float() - m[rows].unsqueeze(1)).exp_().sum(dim=-1)
        sum_exp = all_reduce_tp(local_sum, tp, layer, "forward")
        local_t = targets - vocab_start
        inside = (local_t >= 0) & (local_t < v_local)
        local_t = local_t.masked_fill(~inside, 0)
        target_logit = (logits.gather(1, local_t.unsqueeze(1)).squeeze(1).float() - m).masked_fill(
            ~inside, 0.0
        )
        target_logit = all_reduce_tp(target_logit, tp, layer, "forward")
        log_sum = sum_exp.log()
        # the log-sum-exp: 4 bytes a row
        ctx.save_for_backward(logits, local_t, inside, m + log_sum)
        ctx.memory = memory
        return (log_sum - target_logit).mean()

    @staticmethod
    def backward(ctx, grad):
        logits, local_t, inside, lse = ctx.saved_tensors
        return (
            blocked_gradient(logits, lse, local_t, grad, memory=ctx.memory, at_target=inside),
            None,
            None,
            None,
        )


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, tp: TPContext, memory=None
) -> torch.Tensor:
    """Mean cross-entropy over every token of (b, s, V/t) logits split by vocabulary on the tp ranks, in fp32
    whatever their dtype; equal to F.cross_entropy on the full logits."""
    return _VocabParallelCrossEntropy.apply(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), tp, memory
    )


class VocabParallelCrossEntropy(nn.Module):
    """The model's loss module under tensor parallelism (replaces the dense cross-entropy, and takes its
    memory tracker: the loss reports its peak, model/cross_entropy.py)."""

    def __init__(self, tp: TPContext, memory: MemoryCounter | None = None) -> None:
        super().__init__()
        self.tp, self.memory = tp, memory

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.tp, self.memory)


class SequenceParallelPositions(nn.Module):
    """The position embedding under sequence parallelism: given every position, embed this rank's
    slice of them (the residual stream is (b, s/t, h) here). The weight is whole on every rank and its
    gradient partial (summed over tp by TensorParallelGrads)."""

    def __init__(self, positions: int, hidden: int, tp: TPContext) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(positions, hidden))

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        s_local = pos.numel() // self.tp.size
        # a tensor of its own: the lookup saves its indices, and a view would keep every position alive
        mine = pos[self.tp.rank * s_local : (self.tp.rank + 1) * s_local].clone()
        return F.embedding(mine, self.weight)


def _dense(m: nn.Module, kind: type[_M], name: str) -> _M:
    """`m`, the dense module the plan names, checked to be the `kind` it replaces."""
    if not isinstance(m, kind):
        raise TypeError(
            f"{name}: tensor parallelism replaces a {kind.__name__}, not {type(m).__name__}"
        )
    return m


def _column(m: nn.Module, tp: TPContext, name: str) -> nn.Module:
    """A column-parallel copy of linear `m`: each of its `sections` (q, k, v; gate, up) split by tp."""
    linear = _dense(m, nn.Linear, name)
    return ColumnParallelLinear(
        linear.in_features,
        linear.out_features,
        tp,
        name,
        sections=linear.sections if isinstance(linear, FusedLinear) else None,
        bias=linear.bias is not None,
    )


def _row(m: nn.Module, tp: TPContext, name: str) -> nn.Module:
    linear = _dense(m, nn.Linear, name)
    return RowParallelLinear(
        linear.in_features, linear.out_features, tp, name, bias=linear.bias is not None
    )


def _vocab(m: nn.Module, tp: TPContext, name: str) -> nn.Module:
    table = _dense(m, nn.Embedding, name)
    return VocabParallelEmbedding(table.num_embeddings, table.embedding_dim, tp, name)


def _loss(m: nn.Module, tp: TPContext, name: str) -> nn.Module:
    return VocabParallelCrossEntropy(tp, _dense(m, CrossEntropy, name).memory)


def _positions(m: nn.Module, tp: TPContext, name: str) -> nn.Module:
    table = _dense(m, nn.Embedding, name)
    return SequenceParallelPositions(table.num_embeddings, table.embedding_dim, tp)


#: Megatron's split of the GPT: module name (its last parts) → the tensor-parallel module replacing it.
TP_PLAN: dict[str, Callable[[nn.Module, TPContext, str], nn.Module]] = {
    "wte": _vocab,
    "attn.qkv": _column,  # q, k and v each split by heads (grouped-query: the kv_heads split as the heads)
    "attn.proj": _row,
    "mlp.fc": _column,  # GELU's fc; SwiGLU's gate and up, each split
    "mlp.proj": _row,
    "head": _column,  # logits split by vocabulary, never gathered
    "loss": _loss,
}
#: what sequence parallelism changes on top: positions sliced, layer norms' gradients partial
SP_PLAN: dict[str, Callable[[nn.Module, TPContext, str], nn.Module]] = {
    "wpe": _positions,
}


def _plan_entry(plan: dict, name: str) -> Callable[[nn.Module, TPContext, str], nn.Module] | None:
    return next(
        (make for key, make in plan.items() if name == key or name.endswith(f".{key}")), None
    )


def apply_tensor_parallel(model: nn.Module, tp: TPContext) -> nn.Module:
    """Swap the dense modules of `model` (a GPT or one pipeline stage of it) for Megatron's
    tensor-parallel ones, in place; parameter names are unchanged. The new modules are created on the
    model's device (meta while building) and hold uninitialised shards: initialise by name afterwards."""
    device = next(model.parameters()).device
    plans = [TP_PLAN, SP_PLAN] if tp.sequence_parallel else [TP_PLAN]
    for name, module in list(model.named_modules()):
        make = next((m for plan in plans if (m := _plan_entry(plan, name)) is not None), None)
        if make is not None:
            parent, _, leaf = name.rpartition(".")
            with torch.device(device):
                setattr(
                    model.get_submodule(parent) if parent else model, leaf, make(module, tp, name)
                )
    if isinstance(model, GPT):
        model.tie()  # a tied head's V/t rows are the embedding's: the same split, one parameter again
    return model


def tensor_parallel_role(
    module: nn.Module, leaf: str, sequence_parallel: bool
) -> tuple[bool, bool]:
    """(tp-sharded, sequence-parallel partial) of parameter `leaf` of `module` after the swap: the column-
    and vocabulary-parallel modules' parameters and the row-parallel weights are shards; with sequence
    parallelism the parameters applied to a slice of the sequence — layer norms, position embeddings,
    row-parallel biases — are whole with a partial gradient (TensorParallelGrads sums it over tp)."""
    if isinstance(module, ColumnParallelLinear | VocabParallelEmbedding):
        return True, False
    if isinstance(module, RowParallelLinear):
        return leaf == "weight", leaf == "bias" and module.tp.sequence_parallel
    if isinstance(module, SequenceParallelPositions):
        return False, True
    return False, sequence_parallel and isinstance(module, nn.LayerNorm | RMSNorm)


class TensorParallelGrads(SyncToggle):
    """The `GradSync` of tensor parallelism: after backward, sum over tp the gradients that are partial
    on each tp rank — with sequence parallelism, those of parameters applied to a slice of the sequence
    (layer norms, position embeddings, row-parallel biases: their facts say `sequence_parallel_partial`).
    Without sequence parallelism nothing is partial. It owns no buffer: the data-parallel synchroniser
    zeroes the gradients, and its `main_grads` say where a 16-bit model's fp32 ones are."""

    def __init__(
        self,
        model: nn.Module,
        tp: TPContext,
        *,
        facts: ParamTable,
        main_grads: MainGrads | None = None,
    ) -> None:
        self.tp = tp
        self.main_grads = MainGrads() if main_grads is None else main_grads
        self.params = [p for p in model.parameters() if facts[p].sequence_parallel_partial]

    def wait(self) -> None:
        if not self.params:
            return
        grads = [g for p in self.params if (g := self.main_grads.grad_of(p)) is not None]
        flat = pack(grads)
        self.tp.comm.all_reduce(
            flat,
            "tp",
            label="sequence-parallel grads",
            meta={"layer": "layer norms, positions, row biases", "direction": "backward"},
        )
        unpack(flat, grads)

    def zero_grad(self) -> None:
        return None

    def grad_tensors(self) -> list[torch.Tensor | None]:
        return []
