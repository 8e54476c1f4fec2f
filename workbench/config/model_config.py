"""The model's dimensions: a decoder-only GPT's shape (`ModelConfig`), its named presets, and the error
every bad configuration raises. No torch (re-exported by workbench.config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only GPT's dimensions (nanoGPT's shape: pre-norm blocks, GELU MLP, untied head). With
    `experts` > 0 every block's MLP is a mixture of that many expert MLPs (model/moe.py), each token routed
    to `top_k` of them by a `router` ('softmax' or 'sigmoid' scores, top-k, in fp32)."""

    vocab_size: int = 64
    seq_len: int = 16
    hidden: int = 32
    heads: int = 4
    layers: int = 2
    mlp_ratio: int = 4
    experts: int = 0
    top_k: int = 2
    router: str = "softmax"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def param_count(self) -> int:
        """Ψ: parameters of the unsharded model (checked against the built model in the tests)."""
        h, v, s, f = self.hidden, self.vocab_size, self.seq_len, self.mlp_ratio * self.hidden
        per_layer = (
            2 * h  # ln_1 weight and bias
            + h * 3 * h + 3 * h  # qkv projection
            + h * h + h  # attention output projection
            + 2 * h  # ln_2
            + max(self.experts, 1) * (h * f + f + f * h + h)  # mlp up and down (each expert's)
            + h * self.experts  # the router (no bias)
        )
        return v * h + s * h + self.layers * per_layer + 2 * h + h * v + v

    def validate(self) -> None:
        for name in ("vocab_size", "seq_len", "hidden", "heads", "layers", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{name}={value!r}: must be a positive integer")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ConfigError(f"model.top_k={self.top_k}: each token goes to 1 to experts={self.experts} experts")
        if self.router not in ("softmax", "sigmoid"):
            raise ConfigError(f"model.router={self.router!r}: valid are 'softmax' and 'sigmoid'")
        if self.hidden % self.heads:
            raise ConfigError(
                f"model.heads={self.heads} does not divide model.hidden={self.hidden}; "
                f"valid head counts: {divisors(self.hidden)}"
            )


#: Named model sizes. `tiny` runs a step in milliseconds (tests, notebooks); `small` has a few
#: million parameters (benchmarks); the GPT-2 shapes are for GPUs (GPT-2's BPE vocabulary padded to 50304, a
#: multiple of 64, as nanoGPT does; sequence 1024). Their Ψ counts an untied head: GPT-2's published 124 M ties
#: the head to the embedding — see `param_count` and the README. Anything else is a ModelConfig or a dict.
GPT2_VOCAB, GPT2_SEQ = 50304, 1024
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=64, seq_len=16, hidden=32, heads=4, layers=2),
    "small": ModelConfig(vocab_size=512, seq_len=64, hidden=256, heads=8, layers=4),
    "gpt2-small": ModelConfig(vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=768, heads=12, layers=12),
    "gpt2-medium": ModelConfig(vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=1024, heads=16, layers=24),
    "gpt-1.3b": ModelConfig(vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=2048, heads=16, layers=24),
    # mixtures of experts (model/moe.py): the same shapes, every MLP replaced by E experts, top-k routed
    "tiny-moe": ModelConfig(vocab_size=64, seq_len=16, hidden=32, heads=4, layers=2, experts=4, top_k=2),
    "small-moe": ModelConfig(vocab_size=512, seq_len=64, hidden=256, heads=8, layers=4, experts=8, top_k=2),
    "gpt2-small-moe": ModelConfig(vocab_size=GPT2_VOCAB, seq_len=GPT2_SEQ, hidden=768, heads=12, layers=12,
                                  experts=8, top_k=2),
}


def tp_indivisible(model: ModelConfig, tp: int) -> list[tuple[str, int]]:
    """The model's (dimension, size) pairs that tp ranks cannot share equally: heads, hidden, vocab_size."""
    return [(what, value) for what, value in (("heads", model.heads), ("hidden", model.hidden),
                                              ("vocab_size", model.vocab_size)) if value % tp]


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """ConfigError naming the first dimension tp does not divide, and the tp that would."""
    for what, value in tp_indivisible(model, tp)[:1]:
        valid = divisors(value)
        raise ConfigError(f"tp={tp} does not divide model.{what}={value}: each tensor-parallel rank needs "
                          f"an equal share. Valid tp for this model's {what}: {valid}")


def lr_warning(model: ModelConfig, lr: float) -> str | None:
    """A warning when the learning rate is far above what models of this width train with. Adam's stable
    rate falls roughly as 1/width (μP; GPT-2/3's published rates: 6e-4 at 768, 3e-4 at 1024, 2e-4 at
    2048): take 3e-3 at width 256 — this project's `small` — as the reference and warn above 1.5× of
    3e-3·256/width."""
    safe = 3e-3 * 256 / model.hidden
    if lr > 1.5 * safe:
        return (f"lr={lr:g} is high for hidden={model.hidden}: Adam's stable rate falls about as 1/width; "
                f"try lr ≈ {safe:.1g} (3e-3 × 256 / hidden)")
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
        raise ConfigError(f"model keys {unknown} are unknown; valid keys: {valid} and 'base' (a preset to start from)")
    return dataclasses.replace(PRESETS[base], **d)
