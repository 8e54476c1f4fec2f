"""Predict before running: memory per rank, bytes moved per step, the bubble, and step time — from
the formulas of docs/formulas.md and a description of the hardware.

    estimate(RunConfig(dp=2, tp=2), hardware=calibrate())                                 # a local run
    estimate(RunLayout(params=7.5e9, dp=64, zero=3)).model_state_bytes_per_rank          # 1.875e9
    estimate(RunLayout(model=GPT3_175B, dp=8, tp=8, pp=12, global_batch=1536, microbatches=192,
                       recompute="selective"), hardware=A100_80GB)

`estimate` takes a RunConfig, or a RunLayout (predict/run_layout.py) for a run no RunConfig describes
here: a bare parameter count, a model far beyond this machine. A RunConfig becomes a RunLayout first
(`RunLayout.of`): the estimator reads that one type.

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

from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.config import ModelConfig, RunConfig
from workbench.predict import formulas
from workbench.predict.action_costs import Layout
from workbench.predict.formulas.run import carried, pp_sends, stage_shape

# the presets and the input types, re-exported: wb.Hardware and estimator.A100_80GB are where users find them
from workbench.predict.hardware import A100_80GB as A100_80GB
from workbench.predict.hardware import H100_80GB as H100_80GB
from workbench.predict.hardware import Hardware as Hardware
from workbench.predict.hardware import with_emulated_links as with_emulated_links
from workbench.predict.run_layout import RunLayout as RunLayout
from workbench.predict.run_layout import Traffic as Traffic
from workbench.predict.run_layout import uneven as uneven
from workbench.predict.step_time import predict_step
from workbench.trace.bandwidth import bus_factor

#: GPT-3 175B (Brown et al. 2020): 96 layers, hidden 12288, 96 heads, sequence 2048.
GPT3_175B = ModelConfig(vocab_size=51200, seq_len=2048, hidden=12288, heads=96, layers=96)


@dataclass(kw_only=True)
class Estimate:
    """What `estimate` predicts of one rank of a run: its memory by category, the bytes each of its groups
    sends a step, the bubble, FLOPs and (given a Hardware) the step time and its terms."""

    params: float
    dp: int
    tp: int
    pp: int
    zero: int
    precision: str
    model_state_bytes: dict[str, float]
    model_state_bytes_per_rank: float
    activation_bytes_per_rank: float | None = None
    # zero-bubble schedules: the W stash at its peak (formulas/zero_bubble.py)
    wgrad_stash_bytes_per_rank: float = 0.0
    #: ZeRO-2/3's gradient copies in flight and ZeRO-3's gathered layers (formulas.buffer_bytes)
    buffer_bytes: dict[str, float] = field(default_factory=dict)
    memory_bytes_per_rank: float | None = None
    # group -> bytes each rank sends
    comm_bytes_per_step: dict[str, float] = field(default_factory=dict)
    bubble_fraction: float = 0.0
    # the model's useful FLOPs (formulas/flops.py; MFU's numerator)
    flops_per_step: float | None = None
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
    # offload: the gradient slice out and the parameter slice back
    host_link_bytes_per_step: float = 0.0
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


def estimate(
    run: RunConfig | RunLayout,
    *,
    hardware: Hardware | None = None,
    activations: str = "ours",
    backend_copies: bool = False,
) -> Estimate:
    """The analytic model of `run` (a RunConfig is read as `RunLayout.of(config)`). `hardware`: the step
    time and whether the memory fits (None: memory and bytes only). `activations='megatron'` uses
    Korthikanti et al.'s 16-bit per-layer formula (with dropout masks) instead of the count of what our
    GPT saves. `backend_copies`: gloo's reduce-scatter, which copies its input (a run on gloo).

    What the layout's fields add: `offload` (ZeRO-Offload) moves the optimizer states to the host
    (`host_bytes`) and copies the gradient slice out and the parameters' back each step over the host
    link (the CPU's update time itself is not modelled); `traffic` how gradients travel (compression,
    1-bit Adam, the hierarchical all-reduce, the machines' size); `schedule` and `rule` shape the
    pipeline's step time; `cp` (context parallelism): s/cp tokens a rank (activations ÷ cp, the ring's
    K/V bytes in `comm_bytes_per_step['cp']`), gradients and ZeRO's shards over dp×cp; `ep`: a model
    with experts holds E/ep of them a rank, and its dispatch sends (ep − 1)/ep of each all-to-all's rows
    (`comm_bytes_per_step['ep']`, the `ep` term); `attention='sdpa'`: a fused (flash) kernel saves no s×s
    probabilities (our count only); `uneven_stages`: a pp that does not divide the layers, as Llama 3's
    pipeline (`uneven`: each stage estimated as the busiest)."""
    layout = run if isinstance(run, RunLayout) else RunLayout.of(run)
    params = layout.checked_params()
    model = layout.stage_model()
    local = (  # what one rank holds of its tp × pp shard
        params / (layout.tp * layout.pp)
        if model is None
        else formulas.params_per_rank(
            model,
            tp=layout.tp,
            pp=layout.pp,
            virtual_stages=layout.virtual_stages,
            ep=layout.ep,
            placement=formulas.placement_of(layout.schedule),  # DualPipe: two copies' parts
        )
    )
    out = _model_states(layout, params, local)
    _dp_traffic(out, layout.traffic, local, layout.gradient_width)
    if model is None or layout.global_batch is None:
        return _timed(out, hardware, layout, None)
    if activations == "megatron":
        _megatron_memory(out, layout, model, local, backend_copies)
    else:  # the one memory model: the run's own prediction (formulas/run.py), schedule included
        device = "cuda" if hardware is not None and not hardware.cores else "cpu"
        _run_memory(out, layout.run_dict(backend_copies=backend_copies, device=device))
    out.bubble_fraction = formulas.named_bubble_fraction(
        layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages
    )
    assert layout.model is not None  # the whole model's FLOPs (the busiest stage's are model's)
    tokens = layout.global_batch * model.seq_len
    out.flops_per_step = formulas.model_flops_per_token(layout.model) * tokens
    _activation_traffic(out, layout, model)
    return _timed(out, hardware, layout, model)


def _model_states(layout: RunLayout, params: float, local: float) -> Estimate:
    """The estimate's model states (Rajbhandari et al.: partitioned over dp×cp by ZeRO) and ZeRO-Offload's
    host bytes."""
    shards, offload = layout.dp * layout.cp, layout.offload
    states = formulas.model_state_bytes(
        local, shards, layout.zero, layout.precision, grad_bytes=layout.grad_bytes, offload=offload
    )
    return Estimate(
        params=params,
        dp=layout.dp,
        tp=layout.tp,
        pp=layout.pp,
        zero=layout.zero,
        precision=layout.precision,
        model_state_bytes=states,
        model_state_bytes_per_rank=sum(states.values()),
        microbatches=layout.microbatches,
        offload=offload,
        host_bytes=formulas.offload_host_bytes(local, shards) if offload else {},
        host_link_bytes_per_step=local / shards * (4 + layout.width) if offload else 0.0,
        cp=layout.cp,
        ep=layout.ep,
    )


def _dp_traffic(out: Estimate, traffic: Traffic, local: float, grad_bytes: int) -> None:
    """Set out's dp bytes per step (and per link class, and 1-bit Adam's warm-up bytes)."""
    wire = 2 if traffic.grad_compression != "none" else grad_bytes
    n = out.dp * out.cp  # the ranks that hold the same parameters
    dp_bytes = formulas.dp_bytes_per_step(local, n, out.zero, grad_bytes=wire)
    out.ranks_per_node = traffic.ranks_per_node
    if traffic.optimizer == "onebit-adam":
        out.dp_bytes_warmup, dp_bytes = dp_bytes, formulas.onebit_bytes_per_step(local, n)
    out.comm_bytes_per_step["dp"] = dp_bytes
    if traffic.ranks_per_node and out.zero == 0 and traffic.optimizer != "onebit-adam":
        out.dp_link_bytes = formulas.dp_link_bytes(
            local * wire, n, traffic.ranks_per_node, traffic.allreduce == "hierarchical"
        )


def _run_memory(out: Estimate, run: dict[str, Any]) -> None:
    """Memory from the run's own prediction (formulas/run.py) of its resolved config `run`."""
    categories, total, _ = formulas.predicted_memory(run)
    out.model_state_bytes = {k: categories[k] for k in ("parameter", "gradient", "optimizer_state")}
    out.model_state_bytes_per_rank = sum(out.model_state_bytes.values())
    out.activation_bytes_per_rank = categories["activation"]
    out.wgrad_stash_bytes_per_rank = categories.get("wgrad_stash", 0.0)
    out.buffer_bytes = {
        "comm_buffer": categories["comm_buffer"],
        "temporary": categories["temporary"],
    }
    out.memory_bytes_per_rank = total


def _megatron_memory(
    out: Estimate, layout: RunLayout, model: ModelConfig, local: float, backend_copies: bool
) -> None:
    """Memory with Korthikanti et al.'s activations: activations peak at the end of forward, with no gradient
    copy in flight; the copies peak during backward, as activations are released, and 16-bit gradients' fp32
    copies at the update: none add up."""
    acts, _ = formulas.cp_local(model, layout.cp, layout.cp_rotate)
    act = _megatron_activations(acts, layout)
    out.activation_bytes_per_rank = act
    out.buffer_bytes = formulas.buffer_bytes(
        model,
        local,
        layout.dp * layout.cp,
        layout.zero,
        bucket_mb=layout.bucket_mb,
        width=layout.width,
        prefetch=layout.prefetch,
        backend_copies=backend_copies,
    )
    masters = 4 * local if layout.gradient_width == 2 and not layout.offload else 0
    out.memory_bytes_per_rank = (
        out.model_state_bytes_per_rank
        + max(act, out.buffer_bytes["comm_buffer"], masters)
        + out.buffer_bytes["temporary"]
    )


def _megatron_per_layer(model: ModelConfig, layout: RunLayout) -> float:
    """Korthikanti et al.'s 16-bit activation bytes per layer (Table 2), by SP and recomputation."""
    tp, sequence_parallel, recompute = layout.tp, layout.sequence_parallel, layout.recompute
    sbh = model.seq_len * layout.micro * model.hidden
    a_s_h = model.heads * model.seq_len / model.hidden
    if recompute == "full":
        return 2 * sbh / (tp if sequence_parallel else 1)
    if recompute == "selective":
        return sbh * 34 / tp if sequence_parallel else sbh * (10 + 24 / tp)
    if sequence_parallel:
        return sbh * (34 + 5 * a_s_h) / tp
    return formulas.korthikanti_activation_bytes_per_layer(model, layout.micro, tp)


def _megatron_activations(model: ModelConfig, layout: RunLayout) -> float:
    """Korthikanti et al.'s 16-bit bytes per layer × the first stage's layers × the micro-batches it holds
    (GPipe: all m; DualPipe and DualPipeV: DeepSeek's PP + 1 stages of L/PP layers; the others: min(p, m))."""
    pp, m = layout.pp, layout.microbatches
    if pp > 1 and layout.schedule in ("dualpipe", "dualpipev"):
        held = formulas.deepseek_memory(layout.schedule, pp)
        layers = held.activations * (model.layers // held.stages)
        return layers * _megatron_per_layer(model, layout)
    in_flight = (m if layout.schedule == "gpipe" else min(pp, m)) if pp > 1 else 1
    return in_flight * (model.layers // pp) * _megatron_per_layer(model, layout)


def _activation_traffic(out: Estimate, layout: RunLayout, model: ModelConfig) -> None:
    """Bytes each rank sends per step for the activations: tensor-parallel collectives (bus share), the
    context-parallel ring's K/V (or, all-gathering, its bus share) and the pipeline's transfers."""
    tp, pp, cp = layout.tp, layout.pp, layout.cp
    micro, w, sp = layout.micro, layout.width, layout.sequence_parallel
    acts, _ = formulas.cp_local(model, cp, layout.cp_rotate)
    # rank 0's stages, each running its microbatches (DualPipe: two parts of 1/p, half of them each)
    held = stage_shape(layout.schedule, pp, layout.microbatches, layout.virtual_stages)
    mine = [k for k in range(held.stages) if held.rank_of(k) == 0]
    layers = sum(model.layers // held.model_part(k)[1] for k in mine)
    m = carried(held)
    tp_bytes = formulas.tp_comm_bytes_per_step(
        acts,
        micro,
        tp,
        sequence_parallel=sp,
        microbatches=m,
        layers=layers,
        first=True,
        last=any(held.next_stage(k) is None for k in mine),
        bytes_per_value=w,
        recompute=layout.recompute,
        grad_bytes=layout.gradient_width,
        positions=model.seq_len,
    )
    out.comm_bytes_per_step["tp"] = sum(bus_factor(op, tp) * b for op, b in tp_bytes.items())
    if cp > 1:
        ring = formulas.cp_comm_bytes_per_step(
            model.seq_len,
            micro,
            model.kv_dim,
            cp,
            layers=layers,
            microbatches=m,
            tp=tp,
            width=w,
            rotate=layout.cp_rotate,
            recompute=layout.recompute != "none",
        )
        out.comm_bytes_per_step["cp"] = ring.get("send", 0.0) + (cp - 1) / cp * (
            ring.get("all_gather", 0.0) + ring.get("reduce_scatter", 0.0)
        )
    # four all-to-alls per MoE layer and microbatch, (ep − 1)/ep of their T·k rows leave
    if out.ep > 1:
        rows = micro * model.seq_len * model.top_k * model.hidden * w
        out.comm_bytes_per_step["ep"] = 4 * rows * (out.ep - 1) / out.ep * layers * m
    if pp > 1:  # the busiest rank's activations and gradients; DualPipe's twin gradients
        buffer = micro * acts.seq_len // (tp if sp else 1) * model.hidden * w
        # DualPipe runs at zero = 0 (config/pipeline_rules.py): each rank sends its whole gradient
        twin = out.model_state_bytes["gradient"] if held.placement == "dual" else 0.0
        out.comm_bytes_per_step["pp"] = pp_sends(held) * buffer + twin


def _timed(
    out: Estimate, hw: Hardware | None, layout: RunLayout, model: ModelConfig | None
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
    nodes = out.ranks_per_node or hw.devices_per_node
    intra = out.tp * out.cp * out.dp <= nodes  # the dp group inside a node?
    links = out.dp_link_bytes or {
        "intra" if intra else "inter": out.comm_bytes_per_step.get("dp", 0.0)
    }
    step = predict_step(
        Layout(
            model=model,
            dp=layout.dp,
            tp=layout.tp,
            pp=layout.pp,
            v=layout.virtual_stages,
            m=layout.microbatches,
            micro=layout.micro,
            zero=layout.zero,
            sequence_parallel=layout.sequence_parallel,
            recompute=layout.recompute,
            schedule=layout.schedule,
            width=layout.width,
            grad_bytes=layout.gradient_width,
            bucket_mb=layout.bucket_mb,
            rule=layout.rule or ("gloo" if hw.cores else "nccl"),
            ranks_per_node=out.ranks_per_node,
            dp_link_bytes=tuple(links.items()),
            cp=layout.cp,
            cp_rotate=layout.cp_rotate,
            ep=layout.ep,
        ),
        hw,
    )
    host_s = out.host_link_bytes_per_step / hw.host_link_bw
    out.step_terms = {**step.terms, "offload": host_s}
    out.compute_s = step.terms["compute"] + step.terms["overhead"]
    comm_terms = ("tp", "cp", "ep", "zero3", "dp")
    out.comm_s = sum(step.terms[k] for k in comm_terms) + host_s
    out.step_time_s = step.total_s + host_s
    out.step_time_spread_s = out.step_time_s * hw.spread if hw.spread else None
    return out
