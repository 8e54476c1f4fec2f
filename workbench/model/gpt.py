"""A small GPT (Radford et al. 2019; nanoGPT's shape) that every strategy shards.

    tokens ─ wte + wpe ─ [ x + attn(ln_1(x)) ; x + mlp(ln_2(x)) ] × L ─ ln_f ─ head ─ loss

Attention is written out (scores, mask, softmax, weighted sum) rather than fused, so that the
activations it saves are the ones the Korthikanti et al. formula counts. There is no dropout (every
strategy must be bit-for-bit comparable) and the head is not tied to the embedding (tying would
couple the first and last pipeline stages).

The model is always built dense. Strategies are applied to it afterwards, by `engine/parallelize.py`:
tensor parallelism swaps modules (`parallel.tensor_parallel.apply_tensor_parallel`: qkv and fc
column-parallel, the projections row-parallel, the embedding, head and `loss` split by vocabulary,
`wpe` sliced by sequence), context parallelism sets `CausalSelfAttention.context` and `GPT.positions`
(`parallel/context_parallel.py`), recomputation sets `Block.recompute` / `CausalSelfAttention.recompute`
(`engine/recompute.py`). This file knows nothing of either.

Initialisation is a function of the seed and each parameter's *name* only (`init_tensor`): a shard is
cut from its parameter's full initial value (`full_shapes`, `shard_param` of a swapped module), one
parameter at a time, so every strategy starts from the same model.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.model.moe import MoE


def init_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The initial value of parameter `name` (full, unsharded shape): N(0, 0.02) weights drawn from a
    generator seeded by (seed, name), zero biases, unit layer-norm gains. Drawn on the CPU, whatever the
    default device (the same values on every machine; the caller copies them where the model lives)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape, device="cpu")
    if ".ln" in f".{name}" and leaf == "weight":
        return torch.ones(shape, device="cpu")
    g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return torch.randn(shape, generator=g, device="cpu") * 0.02


class CausalSelfAttention(nn.Module):
    #: set by engine/recompute.py for selective recomputation: rerun the attention core in backward
    recompute: Any = None
    #: set by engine/parallelize.py for attention='sdpa': torch's fused scaled_dot_product_attention (flash
    #: attention where the device has it) — saves no s×s probabilities, faster on GPUs
    fused: bool = False
    #: set by engine/parallelize.py for context parallelism (cp > 1): a parallel.context_parallel.ContextParallel
    #: whose ring attention, over the cp group, replaces the core (the sequence here is this rank's s/cp tokens)
    context: Any = None

    def __init__(self, cfg: ModelConfig, name: str = "") -> None:
        super().__init__()
        self.head_dim, self.name = cfg.head_dim, name
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.register_buffer("mask", causal_mask(cfg.seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)  # (b, s, 3·h/t): this rank's heads (with sequence parallelism, the whole sequence)
        b, s, three_h = qkv.shape
        h = three_h // 3
        heads = h // self.head_dim
        q, k, v = (t.view(b, s, heads, self.head_dim).transpose(1, 2) for t in qkv.split(h, dim=-1))
        if self.recompute is not None:  # selective: keep q, k, v; recompute the rest
            return self.proj(self.recompute.run(f"{self.name}.attn core", self.core, q, k, v))
        return self.proj(self.core(q, k, v))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q·kᵀ/√d, causal) · v for (b, heads, s, d) inputs, returned as (b, s, heads·d)."""
        b, heads, s, d = q.shape
        if self.context is not None:
            return self.context.attention(self.name, q, k, v).transpose(1, 2).reshape(b, s, heads * d)
        if self.fused:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, heads * d)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        probs = scores.masked_fill(self.mask[:s, :s], float("-inf")).softmax(dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, s, heads * d)


def causal_mask(seq_len: int) -> torch.Tensor:
    """True above the diagonal: the positions a token may not attend to. Built on the CPU, then moved to
    the default device: `triu` on the meta device runs torch's Python reference, which imports
    torch._dynamo (~1 s of every rank's start-up, measured)."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device="cpu").triu(1).to(torch.get_default_device())


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, cfg.mlp_ratio * cfg.hidden)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    #: set by engine/recompute.py for full recomputation: keep only the input, rerun in backward
    recompute: Any = None

    def __init__(self, cfg: ModelConfig, name: str = "") -> None:
        super().__init__()
        self.name = name
        self.ln_1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg, name)
        self.ln_2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MoE(cfg, name) if cfg.experts else MLP(cfg)  # model/moe.py: a mixture of experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute is not None:
            return self.recompute.run(self.name, self.body, x)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CrossEntropy(nn.Module):
    """Mean cross-entropy over every token (tensor parallelism swaps in the vocabulary-parallel one)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def uninitialised_embedding(rows: int, dim: int) -> nn.Embedding:
    """An embedding whose weight `init_weights` fills. nn.Embedding's own normal_ draw would be thrown
    away, and on the meta device it runs torch's Python reference, which imports torch._dynamo (~1 s of
    every rank's start-up, measured)."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class GPT(nn.Module):
    """The whole model, or — with `layers`, `first` and `last` — one pipeline stage of it: the first
    stage owns the embeddings, the last the final layer norm, the head and the loss. Parameter names
    are the whole model's ("blocks.5.mlp.fc.weight") on every stage, so initialisation by name gives
    each stage exactly its slice of the single-process model.

    Built under `torch.device("meta")` it stays uninitialised (nothing allocated): apply strategies,
    `to_empty(device=...)`, then `init_weights(seed)`. Built anywhere else it is initialised at once."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, layers: range | None = None, first: bool = True,
                 last: bool = True) -> None:
        super().__init__()
        self.cfg, self.first, self.last = cfg, first, last
        layers = range(cfg.layers) if layers is None else layers
        if first:
            self.wte = uninitialised_embedding(cfg.vocab_size, cfg.hidden)
            self.wpe = uninitialised_embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(cfg, f"blocks.{i}") for i in layers})
        if last:
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab_size)
            self.loss = CrossEntropy()
        if not next(self.parameters()).is_meta:
            self.init_weights(seed)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Each parameter from its full initial value, sharded by its module when a strategy swapped it;
        the causal masks rebuilt (they are not saved state)."""
        for module_name, module in self.named_modules():
            for leaf, p in module.named_parameters(recurse=False):
                name = f"{module_name}.{leaf}" if module_name else leaf
                shapes = getattr(module, "full_shapes", {leaf: tuple(p.shape)})
                full = init_tensor(name, shapes[leaf], seed)
                p.copy_(module.shard_param(leaf, full) if hasattr(module, "shard_param") else full)
                del full  # one full parameter at a time
            if isinstance(module, CausalSelfAttention):
                module.mask = causal_mask(self.cfg.seq_len).to(module.mask.device)
            if isinstance(module, MoE):  # the balancing bias starts at zero (materialised uninitialised)
                module.expert_bias.zero_()

    #: set by engine/parallelize.py under context parallelism: the global positions of this rank's tokens
    positions: torch.Tensor | None = None

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings of the tokens held (a sequence-parallel `wpe` keeps its slice)."""
        # under context parallelism a copy per forward, as arange's: each microbatch's lookup saves its own
        pos = torch.arange(idx.size(1), device=idx.device) if self.positions is None else self.positions.clone()
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
        return self.loss(logits.float(), targets)  # the loss in fp32 whatever the activations' precision
