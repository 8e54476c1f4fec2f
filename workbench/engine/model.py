"""A small GPT (Radford et al. 2019; nanoGPT's shape) that every strategy shards.

    tokens ─ wte + wpe ─ [ x + attn(ln_1(x)) ; x + mlp(ln_2(x)) ] × L ─ ln_f ─ head ─ cross-entropy

Attention is written out (scores, mask, softmax, weighted sum) rather than fused, so that the
activations it saves are the ones the Korthikanti et al. formula counts. There is no dropout (every
strategy must be bit-for-bit comparable) and the head is not tied to the embedding (tying would
couple the first and last pipeline stages).

With a `TPContext` the same classes build Megatron's tensor-parallel layers instead of dense ones
(workbench/parallel/tensor_parallel.py): qkv and fc column-parallel, the projections row-parallel,
the embedding and the head split by vocabulary, the loss vocabulary-parallel. With sequence
parallelism the residual stream between blocks is (b, s/t, h) on each rank.

Initialisation is a function of the seed and each parameter's *name* only (`init_tensor`): a shard is
cut from its parameter's full initial value, one parameter at a time, so every strategy starts from
the same model.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.engine.recompute import Recompute
from workbench.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from workbench.parallel.tp_communications import TPContext


def init_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial value of parameter `name` (full, unsharded shape): N(0, 0.02) weights drawn from a
    generator seeded by (seed, name), zero biases, unit layer-norm gains."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape)
    if ".ln" in f".{name}" and leaf == "weight":
        return torch.ones(shape)
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g) * 0.02


def _column(i: int, o: int, tp: TPContext | None, layer: str, groups: int = 1) -> nn.Module:
    return nn.Linear(i, o) if tp is None else ColumnParallelLinear(i, o, tp, layer, groups)


def _row(i: int, o: int, tp: TPContext | None, layer: str) -> nn.Module:
    return nn.Linear(i, o) if tp is None else RowParallelLinear(i, o, tp, layer)


def _layer_norm(h: int, tp: TPContext | None) -> nn.LayerNorm:
    ln = nn.LayerNorm(h)
    if tp is not None and tp.sequence_parallel:  # applied to a slice of the sequence: partial gradients
        ln.weight.sequence_parallel_partial = ln.bias.sequence_parallel_partial = True
    return ln


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPContext | None = None, layer: str = "",
                 recompute: Recompute | None = None) -> None:
        super().__init__()
        self.head_dim, self.layer, self.rc = cfg.head_dim, layer, recompute
        self.qkv = _column(cfg.hidden, 3 * cfg.hidden, tp, f"{layer}.attn.qkv", groups=3)
        self.proj = _row(cfg.hidden, cfg.hidden, tp, f"{layer}.attn.proj")
        mask = torch.ones(cfg.seq_len, cfg.seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (b, s, 3·h/t): this rank's heads (with sequence parallelism, the whole sequence)
        b, s, three_h = qkv.shape
        h = three_h // 3
        heads = h // self.head_dim
        q, k, v = (t.view(b, s, heads, self.head_dim).transpose(1, 2) for t in qkv.split(h, dim=-1))
        if self.rc is not None and self.rc.mode == "selective":  # keep q, k, v; recompute the rest
            return self.proj(self.rc.run(f"{self.layer}.attn core", self.core, q, k, v))
        return self.proj(self.core(q, k, v))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q·kᵀ/√d, causal) · v for (b, heads, s, d) inputs, returned as (b, s, heads·d)."""
        b, heads, s, d = q.shape
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        probs = scores.masked_fill(self.mask[:s, :s], float("-inf")).softmax(dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, s, heads * d)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPContext | None = None, layer: str = "") -> None:
        super().__init__()
        self.fc = _column(cfg.hidden, cfg.mlp_ratio * cfg.hidden, tp, f"{layer}.mlp.fc")
        self.proj = _row(cfg.mlp_ratio * cfg.hidden, cfg.hidden, tp, f"{layer}.mlp.proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPContext | None = None, layer: str = "",
                 recompute: Recompute | None = None) -> None:
        super().__init__()
        self.layer, self.rc = layer, recompute
        self.ln_1 = _layer_norm(cfg.hidden, tp)
        self.attn = CausalSelfAttention(cfg, tp, layer, recompute)
        self.ln_2 = _layer_norm(cfg.hidden, tp)
        self.mlp = MLP(cfg, tp, layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rc is not None and self.rc.mode == "full":  # keep only the input; rerun in backward
            return self.rc.run(self.layer, self.body, x)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """The whole model, or — with `layers`, `first` and `last` — one pipeline stage of it: the first
    stage owns the embeddings, the last the final layer norm, the head and the loss. Parameter names
    are the whole model's ("blocks.5.mlp.fc.weight") on every stage, so initialisation by name gives
    each stage exactly its slice of the single-process model."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, tp: TPContext | None = None,
                 layers: range | None = None, first: bool = True, last: bool = True,
                 recompute: Recompute | None = None) -> None:
        super().__init__()
        self.cfg, self.tp, self.first, self.last = cfg, tp, first, last
        layers = range(cfg.layers) if layers is None else layers
        if first:
            self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden) if tp is None else \
                VocabParallelEmbedding(cfg.vocab_size, cfg.hidden, tp, "wte")
            self.wpe = nn.Embedding(cfg.seq_len, cfg.hidden)
            if tp is not None and tp.sequence_parallel:
                self.wpe.weight.sequence_parallel_partial = True
        self.blocks = nn.ModuleDict({str(i): Block(cfg, tp, f"blocks.{i}", recompute) for i in layers})
        if last:
            self.ln_f = _layer_norm(cfg.hidden, tp)
            self.head = _column(cfg.hidden, cfg.vocab_size, tp, "head")
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Each parameter from its full initial value, sharded by its module when tensor-parallel."""
        for module_name, module in self.named_modules():
            for leaf, p in module.named_parameters(recurse=False):
                name = f"{module_name}.{leaf}" if module_name else leaf
                shapes = getattr(module, "full_shapes", {leaf: tuple(p.shape)})
                full = init_tensor(name, shapes[leaf], seed)
                p.copy_(module.shard_param(leaf, full) if hasattr(module, "shard_param") else full)
                del full  # one full parameter at a time

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        s = idx.size(1)
        if self.tp is not None and self.tp.sequence_parallel:  # this rank's slice of the positions
            s_local = s // self.tp.size
            pos = torch.arange(self.tp.rank * s_local, (self.tp.rank + 1) * s_local, device=idx.device)
        else:
            pos = torch.arange(s, device=idx.device)
        return self.wte(idx) + self.wpe(pos)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """First stage: x is token ids (b, s); later stages: the hidden states (b, s, h) — (b, s/t, h)
        with sequence parallelism. Last stage: logits (split by vocabulary under tensor
        parallelism), or the mean cross-entropy over every token when `targets` is given. Other
        stages return their hidden states."""
        if self.first:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if not self.last:
            return x
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        logits = logits.float()  # the loss in fp32 whatever the activations' precision (a no-op in fp32)
        if self.tp is not None:
            return vocab_parallel_cross_entropy(logits, targets, self.tp)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
