"""What the estimator reads of a run: `RunLayout` — the model (or only its parameter count), the grid, the
batch, and how parameters, gradients and activations are kept and travel (`Traffic`).

A RunConfig gives one (`RunLayout.of(config)`: what `estimate(config)` does). A run that no RunConfig
describes on this machine is written as one directly, with RunConfig's field names:

    RunLayout(params=7.5e9, dp=64, zero=3)                                  # the ZeRO paper's example
    RunLayout(model=GPT3_175B, dp=8, tp=8, pp=12, global_batch=1536, microbatches=192,
              recompute="selective")                                        # GPT-3 on 768 A100s

Beside RunConfig's fields it says what only an estimate needs: `params` without a model, precision
'mixed' (the ZeRO paper's 16-bit parameters with fp32 masters), `grad_bytes`, the pipeline simulator's
`rule`, and Llama 3's `uneven_stages`. No torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from workbench.config import ConfigError, ModelConfig, RunConfig
from workbench.config.model_config import check_tensor_parallel, divisors

PRECISIONS = ("fp32", "bf16", "fp16", "mixed")


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """How the data-parallel gradients travel: 16-bit compression of the buckets, 1-bit Adam's compressed
    momentum after its warm-up, the hierarchical all-reduce, and the machines' size (ranks per node; 0:
    the hardware's devices per node). RunConfig's fields of the same names."""

    grad_compression: str = "none"
    optimizer: str = "adamw"
    allreduce: str = "backend"
    ranks_per_node: int = 0

    @classmethod
    def of(cls, c: RunConfig) -> Traffic:
        return cls(
            grad_compression=c.grad_compression,
            optimizer=c.optimizer,
            allreduce=c.allreduce,
            ranks_per_node=c.ranks_per_node,
        )


@dataclass(frozen=True, kw_only=True)
class RunLayout:
    """A run as the estimator sees it. Fields named as RunConfig's mean what they mean there; the others:

    model / params   the model, or only its parameter count (then memory of model states and the data-
                     parallel bytes only: no activations, no step time)
    precision        'fp32', 'bf16', 'fp16', or 'mixed' (16-bit with fp32 masters: the ZeRO paper's 16Ψ)
    global_batch     None: no activations, FLOPs or step time (model states and bytes only)
    grad_bytes       bytes a gradient value (None: the precision's own; a 16-bit RunConfig's are 4,
                     Megatron's fp32 main gradients, unless its grad_reduce_dtype is 16-bit)
    traffic          how the data-parallel gradients travel (`Traffic`)
    rule             the pipeline simulator's ('gloo' or 'nccl'; None: gloo on a CPU hardware, else nccl)
    offload          ZeRO-Offload (RunConfig's offload_optimizer): the optimizer states on the host
    uneven_stages    a pp that does not divide the layers, as Llama 3's pipeline (`uneven`)
    """

    model: ModelConfig | None = None
    params: float | None = None
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    precision: str = "mixed"
    global_batch: int | None = None
    microbatches: int = 1
    virtual_stages: int = 1
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    recompute: str = "none"
    attention: str = "eager"
    cp_rotate: str = "ring"
    bucket_mb: float = 25.0
    prefetch: bool = True
    offload: bool = False
    grad_bytes: int | None = None
    traffic: Traffic = Traffic()
    rule: str | None = None
    uneven_stages: bool = False

    @classmethod
    def of(cls, c: RunConfig) -> RunLayout:
        """What the estimator reads of a RunConfig (validated or not); ConfigError for a node placement the
        estimator does not model."""
        if c.node_placement != "block":
            raise ConfigError(
                f"estimate: node_placement={c.node_placement!r} is not modelled: the estimator "
                "puts each tp group on one machine, as 'block' does; estimate node_placement='block'"
            )
        same = ("dp", "tp", "pp", "cp", "ep", "zero", "precision", "global_batch", "microbatches")
        more = ("virtual_stages", "schedule", "sequence_parallel", "recompute", "attention")
        kept = ("cp_rotate", "bucket_mb", "prefetch")
        return cls(
            model=c.model_config,
            **{name: getattr(c, name) for name in (*same, *more, *kept)},
            offload=c.offload_optimizer,
            grad_bytes=4 if c.grad_reduce_dtype == "fp32" else 2,
            traffic=Traffic.of(c),
            rule=c.backend if c.backend in ("gloo", "nccl") else None,
        )

    @property
    def width(self) -> int:
        """Bytes of a parameter or activation value."""
        return 4 if self.precision == "fp32" else 2

    @property
    def gradient_width(self) -> int:
        """Bytes of a gradient value: `grad_bytes`, else the precision's own."""
        return self.grad_bytes or self.width

    @property
    def micro(self) -> int:
        """Sequences a micro-batch (global_batch given)."""
        assert self.global_batch is not None
        return self.global_batch // self.dp // self.microbatches

    def checked_params(self) -> float:
        """Ψ, after ConfigError for what no run could have: an unknown precision, a ZeRO stage, a grid or a
        tp / pp that does not divide the model, offload without ZeRO."""
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision={self.precision!r}: valid are 'fp32', 'bf16', 'fp16' and 'mixed' "
                f"(16-bit + fp32 masters)"
            )
        dp, tp, pp, zero = self.dp, self.tp, self.pp, self.zero
        if zero not in (0, 1, 2, 3) or min(dp, tp, pp) < 1:
            raise ConfigError(
                f"zero={zero}, dp={dp}, tp={tp}, pp={pp}: ZeRO stages are 0–3 and the grid sizes ≥ 1"
            )
        if self.model is None:
            if self.params is None:
                raise ConfigError(
                    "estimate needs a RunConfig, or a RunLayout with a model or params="
                )
            params = self.params
        else:
            params = self._checked_model(self.model)
        if self.offload and zero == 0:
            raise ConfigError(
                "offload=True needs ZeRO (zero=1, 2 or 3): it offloads the partitioned optimizer states"
            )
        return params

    def _checked_model(self, model: ModelConfig) -> float:
        check_tensor_parallel(model, self.tp)
        if model.layers % self.pp and not (self.uneven_stages and uneven(model, self.pp)):
            valid = divisors(model.layers)
            also = (
                ""
                if not self.uneven_stages
                else " (or, with uneven stages, a pp with pp·⌈L/pp⌉ − L ≤ 2)"
            )
            raise ConfigError(
                f"pp={self.pp} does not divide model.layers={model.layers}; valid pp: {valid}{also}"
            )
        return self.params if self.params is not None else model.param_count()

    def stage_model(self) -> ModelConfig | None:
        """The model as each stage is estimated: itself, or under uneven stages the busiest stage's
        (`uneven`)."""
        if self.model is None or self.model.layers % self.pp == 0:
            return self.model
        return uneven(self.model, self.pp)

    def run_dict(self, *, backend_copies: bool, device: str) -> dict[str, Any]:
        """The resolved-config dict that formulas/run.py reads (a run's config.json has the same keys) for
        this layout on `device` ('cuda': CUDA's kernels' saves; 'cpu': the CPU's); `backend_copies`:
        gloo's, whose reduce-scatter copies its input."""
        model = self.stage_model()
        assert model is not None and self.global_batch is not None
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for only_here in (
            "model",
            "params",
            "offload",
            "grad_bytes",
            "traffic",
            "rule",
            "uneven_stages",
        ):
            del fields[only_here]
        return {
            **fields,
            "offload_optimizer": self.offload,
            "model": asdict(model),
            "backend": "gloo" if backend_copies else "nccl",
            "grad_reduce_dtype": "fp32" if self.gradient_width == 4 else "bf16",
            "grad_compression": self.traffic.grad_compression,
            "device": device,
        }


def uneven(model: ModelConfig, pp: int) -> ModelConfig | None:
    """Llama 3's uneven pipeline (Dubey et al. 2024, §3.3.2: 126 layers on 16 stages, one layer fewer on the
    first and on the last, which hold the embedding and the head): when pp does not divide the layers but
    pp·⌈L/pp⌉ exceeds them by at most 2 (and a stage keeps 2 layers or more), the model estimated as
    pp·⌈L/pp⌉ layers — every stage as the busiest holds them, so time and memory are the busiest stage's
    (the first stage's memory counts one layer more than it has: on the safe side). None otherwise."""
    per = -(-model.layers // pp)
    if model.layers % pp == 0 or per < 2 or pp * per - model.layers > 2:
        return None
    return dataclasses.replace(model, layers=pp * per)
