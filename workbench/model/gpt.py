"""A decoder-only transformer that every strategy shards: GPT-2's block (Radford et al. 2019; nanoGPT's
shape) or Llama's (model/llama.py: RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases),
as `ModelConfig` says.

    tokens ─ wte (+ wpe) ─ [ x + attn(ln_1(x)) ; x + mlp(ln_2(x)) ] × L ─ ln_f ─ head ─ loss

Grouped-query attention: q has `heads` heads, k and v `kv_heads` (one fused projection of h + 2·kv_dim
outputs); each K/V head serves heads/kv_heads query heads, expanded to them just before the attention core
(as torchtitan's repeat_kv does) — so the projection, tensor parallelism's split and context parallelism's
ring (which expands per block, parallel/ring_attention.py) carry only the kv_heads.

Attention is written out (scores, mask, softmax, weighted sum) rather than fused, so that the
activations it saves are the ones the Korthikanti et al. formula counts. There is no dropout (every
strategy must be bit-for-bit comparable). The head is tied to the token embedding only where the model asks
(`tie_embeddings`, as Llama 3.2 1B does); tying couples the first and last pipeline stages, so config/rules.py
refuses it with pp > 1 and with ZeRO-3.

The model is always built dense, and handed at construction what its rank's strategy decided
(`ModelWiring`, from `engine/parallelize.py`): the attention's kernel, context parallelism's attention and
this rank's token positions (`parallel/context_parallel.py`), the MoE layers' shared state, recomputation
(`engine/recompute.py`) and the loss's memory tracker — each by a protocol, so this file knows nothing of
the strategies. Tensor parallelism then swaps modules (`parallel.tensor_parallel.apply_tensor_parallel`:
qkv and fc column-parallel, the projections row-parallel, the embedding, head and `loss` split by
vocabulary, `wpe` sliced by sequence). The model says what its pieces are (`units()`: what ZeRO-3 gathers
one at a time).

Initialisation is a function of the seed and each parameter's *name* only (`init_tensor`): a shard is
cut from its parameter's full initial value (`full_shapes`, `shard_param` of a swapped module), one
parameter at a time, so every strategy starts from the same model.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.measure.memory import MemoryCounter
from workbench.model.cross_entropy import CrossEntropy
from workbench.model.fused_linear import FusedLinear
from workbench.model.llama import RMSNorm, SwiGLU, rotary_tables, rotate
from workbench.model.moe import MoE, MoEState


@runtime_checkable
class ShardedModule(Protocol):
    """A module a strategy swapped in that holds a shard of each of its parameters (tensor parallelism's,
    expert parallelism's): `full_shapes` are the whole parameters' shapes and `shard_param` cuts this rank's
    shard from a whole value — how initialisation and checkpoints see the whole model by name."""

    full_shapes: dict[str, tuple[int, ...]]

    def shard_param(self, leaf: str, full: torch.Tensor) -> torch.Tensor: ...


class ContextAttention(Protocol):
    """Attention over a sequence split between ranks (parallel/context_parallel.ContextParallel)."""

    def attention(
        self, layer: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor: ...


class Rerun(Protocol):
    """Activation recomputation (engine/recompute.Recompute): `mode` says what reruns (full: each block,
    selective: each attention core), `run` reruns it in backward."""

    mode: str

    def run(
        self, name: str, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor
    ) -> torch.Tensor: ...


@dataclass(frozen=True, kw_only=True, eq=False)
class ModelWiring:
    """What a rank's strategy hands the model it builds, beyond its config (engine/parallelize.py); the
    defaults are one process's plain model."""

    #: attention='sdpa': torch's fused scaled_dot_product_attention (flash attention where the device has
    #: it) — saves no s×s probabilities, faster on GPUs
    fused_attention: bool = False
    #: context parallelism (cp > 1): its attention, over the cp group, replaces the core (the sequence here is
    #: this rank's s/cp tokens)
    context: ContextAttention | None = None
    #: context parallelism: the global positions of this rank's tokens, on the rank's device (the learned
    #: position embedding looks them up, rotary attention rotates by them); None: 0 … s − 1
    positions: torch.Tensor | None = None
    #: a model with experts: the MoE layers' shared state (model/moe.py); None: each layer its own default
    moe: MoEState | None = None
    #: activation recomputation, full or selective (engine/recompute.py)
    recompute: Rerun | None = None
    #: the rank's memory tracker: the loss reports its bytes at their peak (model/cross_entropy.py)
    memory: MemoryCounter | None = None


PLAIN_MODEL = ModelWiring()


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
    """Causal self-attention; `wiring` says its kernel (fused or written out), context parallelism's
    attention and positions, and whether its core is recomputed (selective recomputation)."""

    # buffers (register_buffer): the causal mask, and with rotary positions the tables
    mask: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(
        self, cfg: ModelConfig, name: str = "", *, wiring: ModelWiring = PLAIN_MODEL
    ) -> None:
        super().__init__()
        self.fused, self.context = wiring.fused_attention, wiring.context
        selective = wiring.recompute is not None and wiring.recompute.mode == "selective"
        #: selective recomputation: rerun the attention core in backward
        self.recompute = wiring.recompute if selective else None
        #: the positions of the tokens this attention sees (rotary tables): this rank's under context
        #: parallelism (each token rotated by its true position in the sequence)
        self.token_positions = (
            torch.arange(cfg.seq_len, device="cpu")
            if wiring.positions is None
            else wiring.positions.to("cpu")
        )
        self.head_dim, self.name, self.theta = cfg.head_dim, name, cfg.rope_theta
        self.group = cfg.heads // cfg.kv  # query heads per K/V head (1: multi-head attention)
        # q, k, v (cfg.qkv_width in all): tensor parallelism splits each
        self.qkv = FusedLinear(cfg.hidden, (cfg.hidden, cfg.kv_dim, cfg.kv_dim), bias=cfg.bias)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden, bias=cfg.bias)
        self.register_buffer("mask", causal_mask(cfg.seq_len), persistent=False)
        self.rope = cfg.positions == "rope"
        if self.rope:
            self.set_positions(self.token_positions)

    def set_positions(self, positions: torch.Tensor) -> None:
        """The rotary tables for the tokens this rank's attention sees, in its order: 0 … s − 1, or under
        context parallelism this rank's s/cp global positions (each token rotated by its true position) —
        on the device and in the dtype of the tables it replaces, shared with every other layer's."""
        like = getattr(self, "cos", None)
        device, dtype = (
            (torch.get_default_device(), torch.float32)
            if like is None
            else (like.device, like.dtype)
        )
        cos, sin = shared_rotary_tables(positions, self.head_dim, self.theta, device, dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (b, s, (h + 2·kv_dim)/t): this rank's heads (sequence parallelism: the whole sequence)
        qkv = self.qkv(x)
        b, s, width = qkv.shape
        d = self.head_dim
        kv_heads = width // (d * (self.group + 2))
        q, k, v = (
            t.view(b, s, -1, d).transpose(1, 2)
            for t in qkv.split([self.group * kv_heads * d, kv_heads * d, kv_heads * d], dim=-1)
        )
        if self.rope:
            q, k = rotate(q, self.cos[:s], self.sin[:s]), rotate(k, self.cos[:s], self.sin[:s])
        if self.recompute is not None:  # selective: keep q, k, v; recompute the rest
            return self.proj(self.recompute.run(f"{self.name}.attn core", self.core, q, k, v))
        return self.proj(self.core(q, k, v))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q·kᵀ/√d, causal) · v for (b, heads, s, d) queries and (b, kv_heads, s, d) keys and values,
        returned as (b, s, heads·d)."""
        b, heads, s, d = q.shape
        # the ring carries the kv_heads, each block expanded where it is used
        if self.context is not None:
            return (
                self.context.attention(self.name, q, k, v).transpose(1, 2).reshape(b, s, heads * d)
            )
        k, v = expand_kv(k, self.group), expand_kv(v, self.group)
        if self.fused:
            return (
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
                .transpose(1, 2)
                .reshape(b, s, heads * d)
            )
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        probs = scores.masked_fill(self.mask[:s, :s], float("-inf")).softmax(dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, s, heads * d)


def expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    """(b, kv_heads, s, d) → (b, kv_heads·group, s, d): each K/V head repeated for the query heads it serves
    (head j of the result is K/V head j // group). A copy (expand, then reshape), nothing saved for backward."""
    if group == 1:
        return t
    b, kv, s, d = t.shape
    return t.unsqueeze(2).expand(b, kv, group, s, d).reshape(b, kv * group, s, d)


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """True above the diagonal: the positions a token may not attend to. One tensor per (length, device),
    shared by every layer (at Llama 3's 8,192 tokens a mask is 64 MiB: one per layer would be 2 GiB for 8B).
    Built on the CPU, then moved: `triu` on the meta device runs torch's Python reference, which imports
    torch._dynamo (~1 s of every rank's start-up, measured)."""
    return _shared_mask(
        seq_len, str(torch.get_default_device() if device is None else torch.device(device))
    )


@functools.lru_cache(maxsize=8)
def _shared_mask(seq_len: int, device: str) -> torch.Tensor:
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device="cpu").triu(1).to(device)


def shared_rotary_tables(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """model/llama.py's (cos, sin) for `positions`, computed once per (positions, head_dim, θ, device, dtype)
    and shared by every layer, as the causal mask is (Llama 3 8B at 8,192 tokens: 8 MiB a layer otherwise)."""
    key = tuple(positions.reshape(-1).tolist())
    return _shared_tables(key, head_dim, float(theta), str(torch.device(device)), dtype)


@functools.lru_cache(maxsize=8)
def _shared_tables(
    positions: tuple[int, ...], head_dim: int, theta: float, device: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rotary_tables(
        torch.tensor(positions, dtype=torch.int64, device="cpu"), head_dim, theta
    )
    return cos.to(device, dtype), sin.to(device, dtype)


class MLP(nn.Module):
    """GPT-2's MLP: proj(gelu(fc(x))), fc to the inner width f."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, cfg.inner, bias=cfg.bias)
        self.proj = nn.Linear(cfg.inner, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def make_norm(cfg: ModelConfig) -> nn.Module:
    """The block's norm: LayerNorm (with a bias where the model has biases) or RMSNorm (model/llama.py)."""
    return RMSNorm(cfg.hidden) if cfg.norm == "rmsnorm" else nn.LayerNorm(cfg.hidden, bias=cfg.bias)


def make_mlp(cfg: ModelConfig, name: str, moe: MoEState | None = None) -> nn.Module:
    """The block's MLP: a mixture of experts (model/moe.py, sharing `moe`), SwiGLU (model/llama.py) or
    GPT-2's."""
    if cfg.experts:
        return MoE(cfg, name, state=moe)
    return SwiGLU(cfg.hidden, cfg.inner, cfg.bias) if cfg.mlp == "swiglu" else MLP(cfg)


class Block(nn.Module):
    def __init__(
        self, cfg: ModelConfig, name: str = "", *, wiring: ModelWiring = PLAIN_MODEL
    ) -> None:
        super().__init__()
        self.name = name
        full = wiring.recompute is not None and wiring.recompute.mode == "full"
        #: full recomputation: keep only the input, rerun in backward
        self.recompute = wiring.recompute if full else None
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, name, wiring=wiring)
        self.ln_2 = make_norm(cfg)
        self.mlp = make_mlp(cfg, name, wiring.moe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute is not None:
            return self.recompute.run(self.name, self.body, x)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


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
    `to_empty(device=...)`, then `init_weights(seed)`. Built anywhere else it is initialised at once.
    `wiring`: what the rank's strategy hands its modules (`ModelWiring`)."""

    def __init__(
        self,
        cfg: ModelConfig,
        seed: int = 0,
        *,
        layers: range | None = None,
        first: bool = True,
        last: bool = True,
        wiring: ModelWiring = PLAIN_MODEL,
    ) -> None:
        super().__init__()
        self.cfg, self.first, self.last = cfg, first, last
        #: the global positions of this rank's tokens (context parallelism), on its device; None: 0 … s − 1
        self.positions = wiring.positions
        layers = range(cfg.layers) if layers is None else layers
        if first:
            self.wte = uninitialised_embedding(cfg.vocab_size, cfg.hidden)
            if cfg.positions == "learned":
                self.wpe = uninitialised_embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleDict(
            {str(i): Block(cfg, f"blocks.{i}", wiring=wiring) for i in layers}
        )
        if last:
            self.ln_f = make_norm(cfg)
            self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=cfg.bias)
            self.loss = CrossEntropy(memory=wiring.memory)
        self.tie()
        if not next(self.parameters()).is_meta:
            self.init_weights(seed)

    def tie(self) -> None:
        """With `tie_embeddings`, the head's weight *is* the token table (V × h, or this tp rank's V/t rows of
        both): called after every step that makes new parameters (building, tensor parallelism's swap,
        materialising)."""
        if self.cfg.tie_embeddings and self.first and self.last:
            self.head.weight = self.wte.weight

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Each parameter from its full initial value, sharded by its module when a strategy swapped it;
        the causal masks and rotary tables rebuilt (they are not saved state). A tied head keeps the token
        table's values (each parameter is set once, by its first name)."""
        done: set[int] = set()
        for module_name, module in self.named_modules():
            for leaf, p in module.named_parameters(recurse=False):
                if id(p) in done:
                    continue
                done.add(id(p))
                name = f"{module_name}.{leaf}" if module_name else leaf
                if isinstance(module, ShardedModule):
                    full = init_tensor(name, module.full_shapes[leaf], seed)
                    p.copy_(module.shard_param(leaf, full))
                else:
                    full = init_tensor(name, tuple(p.shape), seed)
                    p.copy_(full)
                del full  # one full parameter at a time
            if isinstance(module, CausalSelfAttention):
                module.mask = causal_mask(self.cfg.seq_len, module.mask.device)
                if module.rope:  # this rank's positions (context parallelism), on the device now
                    module.set_positions(module.token_positions)
            # the balancing bias starts at zero (materialised uninitialised)
            if isinstance(module, MoE):
                module.expert_bias.zero_()

    def units(self) -> list[tuple[str, nn.Module]]:
        """The model's pieces in forward order, by name — the embeddings (first stage), each block, the final
        norm and the head (last stage): what ZeRO-3 gathers one at a time (parallel/zero3.py). No `wpe`
        with rotary positions."""
        units: list[tuple[str, nn.Module]] = []
        if self.first:
            units.append(("wte", self.wte))
            if self.cfg.positions == "learned":
                units.append(("wpe", self.wpe))
        units += [(f"blocks.{k}", b) for k, b in self.blocks.items()]
        if self.last:
            units += [("ln_f", self.ln_f), ("head", self.head)]
        return units

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings of the tokens held (a sequence-parallel `wpe` keeps its slice);
        with rotary positions, the token embeddings alone (attention rotates q and k)."""
        if self.cfg.positions == "rope":
            return self.wte(idx)
        # under context parallelism a copy per forward, as arange's: each microbatch's lookup saves its own
        pos = (
            torch.arange(idx.size(1), device=idx.device)
            if self.positions is None
            else self.positions.clone()
        )
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
        # in fp32 whatever the activations' precision (model/cross_entropy.py)
        return self.loss(logits, targets)
