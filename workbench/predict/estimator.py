"""Predict before running: memory per rank, bytes moved per step, the bubble, and step time — from
the formulas of docs/formulas.md and a description of the hardware.

    estimate(params=7.5e9, dp=64, zero=3, precision="mixed").model_state_bytes_per_rank   # 1.875e9
    estimate(RunConfig(dp=2, tp=2), hardware=calibrate())                                 # a local run
    estimate(model=GPT3_175B, dp=8, tp=8, pp=12, precision="mixed", global_batch=1536,
             microbatches=192, recompute="selective", hardware=A100_80GB)

Step time (predict/step_time.py): each forward and backward of a micro-batch costed from the
hardware's matmul, attention and element-wise rates, a fixed cost per layer and per stage end, and its
tensor-parallel collectives (α + bytes/β each); the pipeline schedule simulated with those costs; the
data-parallel buckets overlapped with the last backward; the optimizer and a step's fixed cost.
`step_terms` says what each adds, `dominant_term` which is largest. On GPUs from the presets'
achievable rates (the best-shape matmul FLOP/s measured by the MAMF finder × SHAPE_EFFICIENCY, predict/
hardware.py; a custom Hardware without `matmul_flops`: peak × `efficiency`) and links; on this machine from
calibrate()'s measurements.

No torch here: the planner calls it thousands of times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.config import ConfigError, ModelConfig, RunConfig
from workbench.config.model_config import check_tensor_parallel, divisors
from workbench.predict import formulas
from workbench.predict.action_costs import Layout
from workbench.predict.hardware import (
    A100_80GB as A100_80GB,
)  # the presets, re-exported: wb.Hardware and
from workbench.predict.hardware import (
    H100_80GB as H100_80GB,
)  # estimator.A100_80GB are where users find them
from workbench.predict.hardware import Hardware as Hardware
from workbench.predict.hardware import with_emulated_links as with_emulated_links
from workbench.predict.step_time import predict_step
from workbench.trace.bandwidth import bus_factor

#: GPT-3 175B (Brown et al. 2020): 96 layers, hidden 12288, 96 heads, sequence 2048.
GPT3_175B = ModelConfig(vocab_size=51200, seq_len=2048, hidden=12288, heads=96, layers=96)


@dataclass
class Estimate:
    params: float
    dp: int
    tp: int
    pp: int
    zero: int
    precision: str
    model_state_bytes: dict[str, float]
    model_state_bytes_per_rank: float
    activation_bytes_per_rank: float | None = None
    wgrad_stash_bytes_per_rank: float = (
        0.0  # zero-bubble schedules: the W stash at its peak (formulas/zero_bubble.py)
    )
    #: ZeRO-2/3's gradient copies in flight and ZeRO-3's gathered layers (formulas.buffer_bytes)
    buffer_bytes: dict[str, float] = field(default_factory=dict)
    memory_bytes_per_rank: float | None = None
    comm_bytes_per_step: dict[str, float] = field(
        default_factory=dict
    )  # group -> bytes each rank sends
    bubble_fraction: float = 0.0
    flops_per_step: float | None = (
        None  # the model's useful FLOPs (formulas/flops.py; MFU's numerator)
    )
    compute_s: float | None = None
    comm_s: float | None = None
    step_time_s: float | None = None
    fits: bool | None = None
    hardware: str | None = None
    microbatches: int = 1
    #: the dp all-reduce's bytes each rank sends per link class ('intra', 'inter': formulas.dp_link_bytes)
    dp_link_bytes: dict[str, float] = field(default_factory=dict)
    #: 1-bit Adam: the dp bytes of a warm-up step (comm_bytes_per_step['dp'] is the compressed steady state)
    dp_bytes_warmup: float | None = None
    ranks_per_node: int = 0
    #: ZeRO-Offload: the optimizer on the host; `host_bytes` what the host holds per rank (16Ψ/N)
    offload: bool = False
    host_bytes: dict[str, float] = field(default_factory=dict)
    host_link_bytes_per_step: float = (
        0.0  # offload: the gradient slice out and the parameter slice back
    )
    #: seconds each term of the step-time model adds (predict/step_time.py: compute, overhead, tp, zero3,
    #: pipeline, dp, optimizer, step, offload)
    step_terms: dict[str, float] = field(default_factory=dict)
    cp: int = 1  # context parallelism: gradients and ZeRO's shards span dp×cp
    ep: int = 1  # expert parallelism: E/ep experts a rank
    #: ± on step_time_s: the spread the hardware's calibration measured (Hardware.spread × the step); None: none
    step_time_spread_s: float | None = None

    @property
    def dominant_term(self) -> str | None:
        return max(self.step_terms, key=lambda k: self.step_terms[k]) if self.step_terms else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Traffic:
    """How the data-parallel gradients travel: 16-bit compression of the buckets, 1-bit Adam's compressed
    momentum after its warm-up, the hierarchical all-reduce, and the machines' size (ranks per node; 0:
    the hardware's devices per node)."""

    grad_compression: str = "none"
    optimizer: str = "adamw"
    allreduce: str = "backend"
    ranks_per_node: int = 0

    @classmethod
    def of(cls, c: RunConfig) -> Traffic:
        return cls(c.grad_compression, c.optimizer, c.allreduce, c.ranks_per_node)

    def apply(self, out: Estimate, local: float, grad_bytes: int) -> None:
        """Set out's dp bytes per step (and per link class, and 1-bit Adam's warm-up bytes)."""
        wire = 2 if self.grad_compression != "none" else grad_bytes
        n = out.dp * out.cp  # the ranks that hold the same parameters
        dp_bytes = formulas.dp_bytes_per_step(local, n, out.zero, grad_bytes=wire)
        out.ranks_per_node = self.ranks_per_node
        if self.optimizer == "onebit-adam":
            out.dp_bytes_warmup, dp_bytes = dp_bytes, formulas.onebit_bytes_per_step(local, n)
        out.comm_bytes_per_step["dp"] = dp_bytes
        if self.ranks_per_node and out.zero == 0 and self.optimizer != "onebit-adam":
            out.dp_link_bytes = formulas.dp_link_bytes(
                local * wire, n, self.ranks_per_node, self.allreduce == "hierarchical"
            )


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


def _checked(
    params: float | None,
    model: ModelConfig | None,
    precision: str,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    uneven_stages: bool = False,
) -> float:
    """Ψ, after ConfigError for what no run could have: an unknown precision, a ZeRO stage, a grid or a
    tp / pp that does not divide the model."""
    if precision not in ("fp32", "bf16", "fp16", "mixed"):
        raise ConfigError(
            f"precision={precision!r}: valid are 'fp32', 'bf16', 'fp16' and 'mixed' "
            f"(16-bit + fp32 masters)"
        )
    if zero not in (0, 1, 2, 3) or min(dp, tp, pp) < 1:
        raise ConfigError(
            f"zero={zero}, dp={dp}, tp={tp}, pp={pp}: ZeRO stages are 0–3 and the grid sizes ≥ 1"
        )
    if model is None:
        if params is None:
            raise ConfigError("estimate needs a RunConfig, a model, or params=")
        return params
    check_tensor_parallel(model, tp)
    if model.layers % pp and not (uneven_stages and uneven(model, pp)):
        valid = divisors(model.layers)
        also = "" if not uneven_stages else " (or, with uneven stages, a pp with pp·⌈L/pp⌉ − L ≤ 2)"
        raise ConfigError(
            f"pp={pp} does not divide model.layers={model.layers}; valid pp: {valid}{also}"
        )
    return params if params is not None else model.param_count()


def _width(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _megatron_per_layer(
    model: ModelConfig, micro: int, tp: int, sequence_parallel: bool, recompute: str
) -> float:
    """Korthikanti et al.'s 16-bit activation bytes per layer (Table 2), by SP and recomputation."""
    sbh, a_s_h = model.seq_len * micro * model.hidden, model.heads * model.seq_len / model.hidden
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    if recompute == "selective":
        return sbh * 34 / tp if sequence_parallel else sbh * (10 + 24 / tp)
    if sequence_parallel:
        return sbh * (34 + 5 * a_s_h) / tp
    return formulas.korthikanti_activation_bytes_per_layer(model, micro, tp)


def estimate(
    config: RunConfig | None = None,
    *,
    params: float | None = None,
    model: ModelConfig | None = None,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    zero: int = 0,
    precision: str = "mixed",
    global_batch: int | None = None,
    microbatches: int = 1,
    virtual_stages: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    activations: str = "ours",
    hardware: Hardware | None = None,
    bucket_mb: float = 25.0,
    prefetch: bool = True,
    backend_copies: bool = False,
    grad_bytes: int | None = None,
    traffic: Traffic | None = None,
    offload: bool = False,
    schedule: str = "1f1b",
    rule: str | None = None,
    cp: int = 1,
    cp_rotate: str = "ring",
    ep: int = 1,
    attention: str = "eager",
    uneven_stages: bool = False,
) -> Estimate:
    """The analytic model. `activations='megatron'` uses Korthikanti et al.'s 16-bit per-layer formula
    (with dropout masks) instead of the count of what our GPT saves. `grad_bytes`: per gradient value
    (None: the precision's own, the ZeRO paper's 16Ψ; a RunConfig's 16-bit run has fp32 main gradients
    unless its grad_reduce_dtype says 16 bits). `traffic`: how gradients travel (compression, 1-bit Adam,
    hierarchical all-reduce, machines' size). `offload`: ZeRO-Offload — the optimizer states leave the
    device for the host (`host_bytes`), and each step copies the gradient slice out and the parameters'
    back over the host link (the CPU's update time itself is not modelled). `schedule` and `rule` (the
    pipeline simulator's: 'gloo' or 'nccl'; None: gloo on a CPU hardware, else nccl) shape the pipeline's
    step time. `cp`: context parallelism — s/cp tokens a rank (activations ÷ cp, the ring's K/V bytes in
    `comm_bytes_per_step['cp']`), gradients and ZeRO's shards over dp×cp. `ep`: a model with experts holds
    E/ep of them a rank, and its dispatch sends (ep − 1)/ep of each all-to-all's rows (`comm_bytes_per_step
    ['ep']`, the `ep` term). `attention='sdpa'`: a fused (flash) kernel saves no s×s probabilities (our
    count only: `activations='ours'`). `uneven_stages`: a pp that does not divide the layers, as Llama 3's
    pipeline (`uneven`)."""
    if config is not None:
        if config.node_placement != "block":
            raise ConfigError(
                f"estimate: node_placement={config.node_placement!r} is not modelled: the estimator "
                "puts each tp group on one machine, as 'block' does; estimate node_placement='block'"
            )
        return estimate(
            None,
            **_run_kwargs(config),
            activations=activations,
            hardware=hardware,
            backend_copies=backend_copies,
            rule={"gloo": "gloo", "nccl": "nccl"}.get(config.backend, rule),
        )
    params = _checked(params, model, precision, dp, tp, pp, zero, uneven_stages)
    flops_model = model
    if model is not None and model.layers % pp:  # uneven stages: each estimated as the busiest
        model = uneven(model, pp)
    if offload and zero == 0:
        raise ConfigError(
            "offload=True needs ZeRO (zero=1, 2 or 3): it offloads the partitioned optimizer states"
        )
    w, shards = _width(precision), dp * cp  # ZeRO shards, and gradients reduce, over dp×cp
    # model states: what one rank holds of its tp × pp shard, partitioned over dp×cp by ZeRO
    local = (
        params / (tp * pp)
        if model is None
        else formulas.params_per_rank(model, tp, pp, virtual_stages, 0, ep=ep)
    )
    states = formulas.model_state_bytes(local, shards, zero, precision, grad_bytes, offload)
    out = Estimate(
        params,
        dp,
        tp,
        pp,
        zero,
        precision,
        states,
        sum(states.values()),
        microbatches=microbatches,
        offload=offload,
        host_bytes=formulas.offload_host_bytes(local, shards) if offload else {},
        host_link_bytes_per_step=local / shards * (4 + w) if offload else 0.0,
        cp=cp,
        ep=ep,
    )
    g = grad_bytes or w
    (traffic or Traffic()).apply(out, local, g)
    if model is None or global_batch is None:
        return _timed(out, hardware, None, {})
    micro = global_batch // dp // microbatches
    if activations == "megatron":
        acts, core = formulas.cp_local(model, cp, cp_rotate)
        act = _megatron_activations(
            acts, micro, tp, pp, microbatches, sequence_parallel, recompute, schedule
        )
        out.activation_bytes_per_rank = act
        out.buffer_bytes = formulas.buffer_bytes(
            model, local, shards, zero, bucket_mb, w, prefetch, backend_copies
        )
        # activations peak at the end of forward, with no gradient copy in flight; the copies peak during
        # backward, as activations are released, and 16-bit gradients' fp32 copies at the update: none add up
        masters = 4 * local if g == 2 and not offload else 0
        out.memory_bytes_per_rank = (
            out.model_state_bytes_per_rank
            + max(act, out.buffer_bytes["comm_buffer"], masters)
            + out.buffer_bytes["temporary"]
        )
    else:  # the one memory model: the run's own prediction (formulas/run.py), schedule included
        run = _run_dict(
            model,
            dp,
            tp,
            pp,
            zero,
            precision,
            global_batch,
            microbatches,
            virtual_stages,
            sequence_parallel,
            recompute,
            bucket_mb,
            prefetch,
            backend_copies,
            g,
            offload,
            schedule,
            cp,
            cp_rotate,
            ep,
            attention,
            traffic,
            hardware,
        )
        categories, total, _ = formulas.predicted_memory(run)
        out.model_state_bytes = {
            k: categories[k] for k in ("parameter", "gradient", "optimizer_state")
        }
        out.model_state_bytes_per_rank = sum(out.model_state_bytes.values())
        out.activation_bytes_per_rank = categories["activation"]
        out.wgrad_stash_bytes_per_rank = categories.get("wgrad_stash", 0.0)
        out.buffer_bytes = {
            "comm_buffer": categories["comm_buffer"],
            "temporary": categories["temporary"],
        }
        out.memory_bytes_per_rank = total
    out.bubble_fraction = formulas.named_bubble_fraction(schedule, pp, microbatches, virtual_stages)
    out.flops_per_step = formulas.model_flops_per_token(flops_model) * global_batch * model.seq_len
    _activation_traffic(out, model, micro, sequence_parallel, recompute, w, g, cp_rotate)
    return _timed(
        out,
        hardware,
        model,
        {
            "v": virtual_stages,
            "micro": micro,
            "sequence_parallel": sequence_parallel,
            "recompute": recompute,
            "schedule": schedule,
            "width": w,
            "cp": cp,
            "ep": ep,
            "cp_rotate": cp_rotate,
            "grad_bytes": g,
            "bucket_mb": bucket_mb,
            "rule": rule,
        },
    )


def _activation_traffic(
    out: Estimate,
    model: ModelConfig,
    micro: int,
    sequence_parallel: bool,
    recompute: str,
    w: int,
    g: int,
    cp_rotate: str,
) -> None:
    """Bytes each rank sends per step for the activations: tensor-parallel collectives (bus share), the
    context-parallel ring's K/V (or, all-gathering, its bus share) and the pipeline's transfers."""
    tp, pp, cp, m = out.tp, out.pp, out.cp, out.microbatches
    acts, _ = formulas.cp_local(model, cp, cp_rotate)
    tp_bytes = formulas.tp_comm_bytes_per_step(
        acts,
        micro,
        tp,
        sequence_parallel,
        m,
        model.layers // pp,
        True,
        pp == 1,
        w,
        recompute,
        g,
        model.seq_len,
    )
    out.comm_bytes_per_step["tp"] = sum(bus_factor(op, tp) * b for op, b in tp_bytes.items())
    if cp > 1:
        ring = formulas.cp_comm_bytes_per_step(
            model.seq_len,
            micro,
            model.kv_dim,
            cp,
            model.layers // pp,
            m,
            tp,
            w,
            cp_rotate,
            recompute != "none",
        )
        out.comm_bytes_per_step["cp"] = ring.get("send", 0.0) + (cp - 1) / cp * (
            ring.get("all_gather", 0.0) + ring.get("reduce_scatter", 0.0)
        )
    if (
        out.ep > 1
    ):  # four all-to-alls per MoE layer and microbatch, (ep − 1)/ep of their T·k rows leave
        rows = micro * model.seq_len * model.top_k * model.hidden * w
        out.comm_bytes_per_step["ep"] = 4 * rows * (out.ep - 1) / out.ep * (model.layers // pp) * m
    if pp > 1:
        out.comm_bytes_per_step["pp"] = (
            2 * m * micro * acts.seq_len // (tp if sequence_parallel else 1) * model.hidden * w
        )


def _run_kwargs(c: RunConfig) -> dict[str, Any]:
    """estimate()'s arguments from a RunConfig."""
    return {
        "model": c.model_config,
        "dp": c.dp,
        "tp": c.tp,
        "pp": c.pp,
        "zero": c.zero,
        "precision": c.precision,
        "global_batch": c.global_batch,
        "microbatches": c.microbatches,
        "virtual_stages": c.virtual_stages,
        "sequence_parallel": c.sequence_parallel,
        "recompute": c.recompute,
        "bucket_mb": c.bucket_mb,
        "prefetch": c.prefetch,
        "traffic": Traffic.of(c),
        "grad_bytes": 4 if c.grad_reduce_dtype == "fp32" else 2,
        "offload": c.offload_optimizer,
        "schedule": c.schedule,
        "cp": c.cp,
        "cp_rotate": c.cp_rotate,
        "ep": c.ep,
        "attention": c.attention,
    }


def _megatron_activations(
    model: ModelConfig,
    micro: int,
    tp: int,
    pp: int,
    microbatches: int,
    sequence_parallel: bool,
    recompute: str,
    schedule: str,
) -> float:
    """Korthikanti et al.'s 16-bit bytes per layer × the first stage's layers × the micro-batches it holds
    (GPipe: all m; the others: min(p, m))."""
    in_flight = (microbatches if schedule == "gpipe" else min(pp, microbatches)) if pp > 1 else 1
    return (
        in_flight
        * (model.layers // pp)
        * _megatron_per_layer(model, micro, tp, sequence_parallel, recompute)
    )


def _run_dict(
    model: ModelConfig,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    precision: str,
    global_batch: int,
    microbatches: int,
    virtual_stages: int,
    sequence_parallel: bool,
    recompute: str,
    bucket_mb: float,
    prefetch: bool,
    backend_copies: bool,
    grad_bytes: int,
    offload: bool,
    schedule: str,
    cp: int,
    cp_rotate: str,
    ep: int,
    attention: str,
    traffic: Traffic | None,
    hardware: Hardware | None,
) -> dict[str, Any]:
    """The resolved-config dict formulas/run.py reads, for the estimate's arguments (a GPU hardware:
    CUDA's kernels' saves; none or a CPU: the CPU's)."""
    return {
        "model": asdict(model),
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "zero": zero,
        "precision": precision,
        "global_batch": global_batch,
        "microbatches": microbatches,
        "virtual_stages": virtual_stages,
        "sequence_parallel": sequence_parallel,
        "recompute": recompute,
        "bucket_mb": bucket_mb,
        "prefetch": prefetch,
        "backend": "gloo" if backend_copies else "nccl",
        "grad_reduce_dtype": "fp32" if grad_bytes == 4 else "bf16",
        "offload_optimizer": offload,
        "schedule": schedule,
        "cp": cp,
        "cp_rotate": cp_rotate,
        "ep": ep,
        "attention": attention,
        "grad_compression": (traffic or Traffic()).grad_compression,
        "device": "cuda" if hardware is not None and not hardware.cores else "cpu",
    }


def _timed(
    out: Estimate, hw: Hardware | None, model: ModelConfig | None, layout: dict[str, Any]
) -> Estimate:
    """Step time from predict/step_time.py: per-action costs, the schedule simulated, the buckets'
    overlap, the optimizer and the fixed costs; ZeRO-Offload's host copies added."""
    if hw is None:
        return out
    out.hardware = hw.name
    if out.memory_bytes_per_rank is not None:
        out.fits = out.memory_bytes_per_rank <= hw.usable_memory * hw.memory_bytes
    if out.flops_per_step is None or model is None:
        return out
    rule = layout.pop("rule", None) or ("gloo" if hw.cores else "nccl")
    intra = out.tp * out.cp * out.dp <= (
        out.ranks_per_node or hw.devices_per_node
    )  # the dp group inside a node?
    links = out.dp_link_bytes or {
        "intra" if intra else "inter": out.comm_bytes_per_step.get("dp", 0.0)
    }
    layout["dp_link_bytes"] = tuple(links.items())
    step = predict_step(
        Layout(
            model=model,
            dp=out.dp,
            tp=out.tp,
            pp=out.pp,
            m=out.microbatches,
            zero=out.zero,
            rule=rule,
            ranks_per_node=out.ranks_per_node,
            **layout,
        ),
        hw,
    )
    host_s = out.host_link_bytes_per_step / hw.host_link_bw
    out.step_terms = {**step.terms, "offload": host_s}
    out.compute_s = step.terms["compute"] + step.terms["overhead"]
    out.comm_s = (
        step.terms["tp"]
        + step.terms["cp"]
        + step.terms["ep"]
        + step.terms["zero3"]
        + step.terms["dp"]
        + host_s
    )
    out.step_time_s = step.total_s + host_s
    out.step_time_spread_s = out.step_time_s * hw.spread if hw.spread else None
    return out
