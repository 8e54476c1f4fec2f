"""The model's dimensions: a decoder-only GPT's shape (`ModelConfig`), its named presets, and the error
every bad configuration raises. No torch (re-exported by workbench.config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypedDict


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the bad value and what would be valid."""


def divisors(n: int, also: int | None = None, most: int = 24) -> list[int]:
    """The divisors of n (of `also` too, where given), ascending: found up to √n, so a value of 10⁹ answers at
    once; at most `most` of them (a message lists the useful small ones)."""
    if n < 1:
        return []
    found: set[int] = set()
    d = 1
    while d * d <= n:
        if n % d == 0:
            found |= {d, n // d}
        d += 1
    out = sorted(x for x in found if also is None or also % x == 0)
    return out[:most]


#: the choices of a block's parts (ModelConfig's fields of the same names)
NORMS, MLPS, POSITIONS = ("layernorm", "rmsnorm"), ("gelu", "swiglu"), ("learned", "rope")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-only transformer's dimensions and the parts of its block. The defaults are GPT-2's block
    (nanoGPT's shape): pre-norm LayerNorm, a GELU MLP of `mlp_ratio`·hidden, learned positions, full
    multi-head attention, biases everywhere, an untied head. A Llama-style block (Touvron et al. 2023;
    Llama 3, Dubey et al. 2024) changes five of them:

        norm="rmsnorm"       RMSNorm: x / rms(x) · g, no mean, no bias (Zhang and Sennrich 2019)
        mlp="swiglu"         down(silu(gate(x)) · up(x)): three matrices of `ffn_hidden` (Shazeer 2020)
        positions="rope"     rotary positions inside attention (Su et al. 2021), base `rope_theta`; no wpe
        kv_heads < heads     grouped-query attention (Ainslie et al. 2023): heads/kv_heads queries share
                             each K/V head — K/V are kv_heads·head_dim wide, not hidden
        bias=False           no bias in any linear or norm

    and may tie the head to the token embedding (`tie_embeddings`). With `experts` > 0 every block's MLP is
    a mixture of that many expert MLPs (model/moe.py, each a GELU or SwiGLU MLP), each token routed to
    `top_k` of them by a `router` ('softmax' or 'sigmoid' scores, top-k, in fp32)."""

    vocab_size: int = 64
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    experts: int = 0
    top_k: int = 2
    router: str = "softmax"
    norm: str = "layernorm"
    mlp: str = "gelu"
    positions: str = "learned"
    kv_heads: int = 0  # 0: as many as `heads` (multi-head attention)
    ffn_hidden: int = 0  # the MLP's inner width; 0: mlp_ratio × hidden
    bias: bool = True
    tie_embeddings: bool = False
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        """K/V heads: `kv_heads`, or `heads` when 0."""
        return self.kv_heads or self.heads

    @property
    def kv_dim(self) -> int:
        """The width of K (and of V) per token: kv heads × head_dim (= hidden without grouped queries)."""
        return self.kv * self.head_dim

    @property
    def qkv_width(self) -> int:
        """The fused q, k, v projection's output width: hidden + 2·kv_dim."""
        return self.hidden + 2 * self.kv_dim

    @property
    def inner(self) -> int:
        """f, the MLP's inner width: `ffn_hidden`, else mlp_ratio × hidden."""
        return self.ffn_hidden or self.mlp_ratio * self.hidden

    @property
    def mlp_in_width(self) -> int:
        """The MLP's first projection's output width: f (GELU), or 2f (SwiGLU's gate and up, fused)."""
        return 2 * self.inner if self.mlp == "swiglu" else self.inner

    @property
    def family(self) -> str:
        """'llama' for RMSNorm + SwiGLU + RoPE blocks, 'gpt' for GPT-2's, 'custom' for any other mix."""
        parts = (self.norm, self.mlp, self.positions)
        return {
            NORMS[0] + MLPS[0] + POSITIONS[0]: "gpt",
            NORMS[1] + MLPS[1] + POSITIONS[1]: "llama",
        }.get("".join(parts), "custom")

    def norm_params(self) -> int:
        """One norm's parameters: gain (and LayerNorm's bias where the model has biases)."""
        return self.hidden * (2 if self.norm == "layernorm" and self.bias else 1)

    def attention_params(self) -> int:
        """q, k, v (fused: h × (h + 2·kv_dim)) and the output projection (h × h), with their biases."""
        h = self.hidden
        return h * self.qkv_width + h * h + (self.qkv_width + h if self.bias else 0)

    def mlp_params(self) -> int:
        """One (expert's) MLP: h·f·(2 or 3 matrices: up and down, or SwiGLU's gate, up and down), biases."""
        h, f = self.hidden, self.inner
        return h * self.mlp_in_width + f * h + (self.mlp_in_width + h if self.bias else 0)

    def layer_params(self) -> int:
        """One block: two norms, attention, the MLP (each expert's) and the router (h·E, no bias)."""
        return (
            2 * self.norm_params()
            + self.attention_params()
            + max(self.experts, 1) * self.mlp_params()
            + self.hidden * self.experts
        )

    def embedding_params(self) -> int:
        """The token table V·h, and the learned positions s·h (none with RoPE)."""
        return self.hidden * (
            self.vocab_size + (self.seq_len if self.positions == "learned" else 0)
        )

    def head_params(self) -> int:
        """The head's h·V (none when tied to the token table) and its bias."""
        return (0 if self.tie_embeddings else self.hidden * self.vocab_size) + (
            self.vocab_size if self.bias else 0
        )

    def param_count(self) -> int:
        """Ψ: parameters of the unsharded model (checked against the built model in the tests)."""
        return (
            self.embedding_params()
            + self.layers * self.layer_params()
            + self.norm_params()
            + self.head_params()
        )

    def validate(self) -> None:
        for name in ("vocab_size", "seq_len", "hidden", "heads", "layers", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"model.{name}={value!r}: must be a positive integer")
        for name in ("kv_heads", "ffn_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(
                    f"model.{name}={value!r}: must be 0 (the default) or a positive integer"
                )
        for name, valid in (("norm", NORMS), ("mlp", MLPS), ("positions", POSITIONS)):
            if getattr(self, name) not in valid:
                raise ConfigError(f"model.{name}={getattr(self, name)!r}: valid are {list(valid)}")
        for name in ("bias", "tie_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={getattr(self, name)!r}: must be true or false")
        theta = self.rope_theta
        if (
            isinstance(theta, bool)
            or not isinstance(theta, (int, float))
            or not 1 < theta < float("inf")
        ):
            raise ConfigError(
                f"model.rope_theta={theta!r}: the rotary base must be a finite number above 1"
            )
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ConfigError(
                f"model.top_k={self.top_k}: each token goes to 1 to experts={self.experts} experts"
            )
        if self.router not in ("softmax", "sigmoid"):
            raise ConfigError(f"model.router={self.router!r}: valid are 'softmax' and 'sigmoid'")
        if self.hidden % self.heads:
            raise ConfigError(
                f"model.heads={self.heads} does not divide model.hidden={self.hidden}; "
                f"valid head counts: {divisors(self.hidden)}"
            )
        if self.kv_heads and self.heads % self.kv_heads:
            raise ConfigError(
                f"model.kv_heads={self.kv_heads} does not divide model.heads={self.heads}: each K/V "
                f"head serves an equal group of query heads; valid kv_heads: {divisors(self.heads)}"
            )
        if self.positions == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"model.positions='rope' rotates pairs of a head's dimensions: head_dim="
                f"{self.head_dim} (hidden/heads) must be even"
            )


class LlamaBlock(TypedDict):
    """The fields that make a ModelConfig's block Llama's, unpacked into each Llama preset (`**LLAMA`)."""

    norm: str
    mlp: str
    positions: str
    bias: bool


class Llama3Shape(LlamaBlock):
    """Llama's block with Llama 3's vocabulary, sequence and rotary base (`**LLAMA3`)."""

    vocab_size: int
    seq_len: int
    rope_theta: float


#: Named model sizes. `tiny` runs a step in milliseconds (tests, notebooks); `small` has a few
#: million parameters (benchmarks); the GPT-2 shapes are for GPUs (GPT-2's BPE vocabulary padded to 50304, a
#: multiple of 64, as nanoGPT does; sequence 1024). Their Ψ counts an untied head: GPT-2's published 124 M ties
#: the head to the embedding — see `param_count` and docs/guide/models-and-data.md. The Llama shapes: `tiny-llama` and
#: `small-llama` the CPU sizes of `tiny` and `small` with Llama's block (an inner width of about 8/3·h rounded
#: to a multiple of 32, as Llama rounds its own); `llama3-1b` is Llama 3.2 1B (tied head) for one GPU; 8B,
#: 70B and 405B are Llama 3.1's published dimensions (Dubey et al. 2024, table 3; vocabulary 128,256,
#: RoPE base 500,000, sequence 8,192) for the estimator and the planner. Anything else is a ModelConfig or a
#: dict.
GPT2_VOCAB, GPT2_SEQ = 50304, 1024
LLAMA: LlamaBlock = {"norm": "rmsnorm", "mlp": "swiglu", "positions": "rope", "bias": False}
LLAMA3: Llama3Shape = {**LLAMA, "vocab_size": 128256, "seq_len": 8192, "rope_theta": 500000.0}
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=64, seq_len=16, hidden=32, heads=4, layers=2),
    "small": ModelConfig(vocab_size=512, seq_len=64, hidden=256, heads=8, layers=4),
    "gpt2-small": ModelConfig(
        vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=768, heads=12, layers=12
    ),
    "gpt2-medium": ModelConfig(
        vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=1024, heads=16, layers=24
    ),
    "gpt-1.3b": ModelConfig(
        vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=2048, heads=16, layers=24
    ),
    # mixtures of experts (model/moe.py): the same shapes, every MLP replaced by E experts, top-k routed
    "tiny-moe": ModelConfig(
        vocab_size=64, seq_len=16, hidden=32, heads=4, layers=2, experts=4, top_k=2
    ),
    "small-moe": ModelConfig(
        vocab_size=512, seq_len=64, hidden=256, heads=8, layers=4, experts=8, top_k=2
    ),
    "gpt2-small-moe": ModelConfig(
        vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=768, heads=12, layers=12, experts=8, top_k=2
    ),
    # Llama's block: RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases
    "tiny-llama": ModelConfig(
        vocab_size=64, seq_len=16, hidden=32, heads=4, kv_heads=2, layers=2, ffn_hidden=96, **LLAMA
    ),
    "small-llama": ModelConfig(
        vocab_size=512,
        seq_len=64,
        hidden=256,
        heads=8,
        kv_heads=2,
        layers=4,
        ffn_hidden=704,
        **LLAMA,
    ),
    # Mixtral's shape, in small
    "tiny-llama-moe": ModelConfig(
        vocab_size=64,
        seq_len=16,
        hidden=32,
        heads=4,
        kv_heads=2,
        layers=2,
        ffn_hidden=64,
        experts=4,
        top_k=2,
        **LLAMA,
    ),
    "llama3-1b": ModelConfig(
        hidden=2048, heads=32, kv_heads=8, layers=16, ffn_hidden=8192, tie_embeddings=True, **LLAMA3
    ),
    "llama3-8b": ModelConfig(
        hidden=4096, heads=32, kv_heads=8, layers=32, ffn_hidden=14336, **LLAMA3
    ),
    "llama3-70b": ModelConfig(
        hidden=8192, heads=64, kv_heads=8, layers=80, ffn_hidden=28672, **LLAMA3
    ),
    "llama3-405b": ModelConfig(
        hidden=16384, heads=128, kv_heads=8, layers=126, ffn_hidden=53248, **LLAMA3
    ),
}


def tp_indivisible(model: ModelConfig, tp: int) -> list[tuple[str, int]]:
    """The model's (dimension, size) pairs that tp ranks cannot share equally: heads, K/V heads (Megatron
    splits each K/V group whole, never replicating one: a tp that does not divide them is refused), the
    MLP's inner width, hidden and vocab_size."""
    dims = (
        ("heads", model.heads),
        ("kv_heads", model.kv),
        ("ffn_hidden", model.inner),
        ("hidden", model.hidden),
        ("vocab_size", model.vocab_size),
    )
    return [(what, value) for what, value in dims if value % tp]


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """ConfigError naming the first dimension tp does not divide, and the tp that would (every dimension)."""
    for what, value in tp_indivisible(model, tp)[:1]:
        valid = [t for t in divisors(value) if not tp_indivisible(model, t)]
        why = (
            " — each tp rank holds whole K/V heads, as Megatron-LM splits them (a K/V head is never "
            "replicated over ranks here)"
            if what == "kv_heads"
            else ""
        )
        raise ConfigError(
            f"tp={tp} does not divide model.{what}={value}: each tensor-parallel rank needs "
            f"an equal share{why}. Valid tp for this model: {valid}"
        )


def lr_warning(model: ModelConfig, lr: float) -> str | None:
    """A warning when the learning rate is far above what models of this width train with. Adam's stable
    rate falls roughly as 1/width (μP; GPT-2/3's published rates: 6e-4 at 768, 3e-4 at 1024, 2e-4 at
    2048): take 3e-3 at width 256 — this project's `small` — as the reference and warn above 1.5× of
    3e-3·256/width."""
    safe = 3e-3 * 256 / model.hidden
    if lr > 1.5 * safe:
        return (
            f"lr={lr:g} is high for hidden={model.hidden}: Adam's stable rate falls about as 1/width; "
            f"try lr ≈ {safe:.1g} (3e-3 × 256 / hidden)"
        )
    return None


def model_from_dict(d: dict[str, Any]) -> ModelConfig:
    """A model given as changes to a named preset: {"base": "small", "layers": 8} (base: 'tiny' when left
    out — say it, as the CLI prints the dims that result)."""
    d = dict(d)
    base = d.pop("base", "tiny")
    if base not in PRESETS:
        raise ConfigError(f"model base={base!r}: unknown preset; valid presets: {sorted(PRESETS)}")
    valid = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(d) - set(valid))
    if unknown:
        raise ConfigError(
            f"model keys {unknown} are unknown; valid keys: {valid} and 'base' (a preset to start from)"
        )
    return dataclasses.replace(PRESETS[base], **d)
