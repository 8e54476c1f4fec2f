"""A run's predictions from its resolved config (config.json, or a RunConfig's dict): what summary.json
puts beside each measurement. Plain arithmetic, no torch."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import replace
from typing import Any, TypedDict

from workbench.config import ModelConfig
from workbench.config.grid import replica_group
from workbench.predict.formulas.activations import (
    activation_bytes,
    backward_extra_bytes,
    loss_bytes,
    stage_activation_bytes,
)
from workbench.predict.formulas.comm import tp_comm_bytes_per_step
from workbench.predict.formulas.context_parallel import cp_comm_bytes_per_step
from workbench.predict.formulas.expert_parallel import moe_comm_bytes
from workbench.predict.formulas.memory import (
    buffer_bytes,
    model_state_bytes,
    offload_host_bytes,
    params_per_rank,
    placement_of,
)
from workbench.predict.formulas.zero_bubble import wgrad_stash_bytes
from workbench.schedules.build import Schedule, build_schedule


def predicted_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, float]:
    """The formulas' memory per rank for this run, by category: model states, activations, the loss's bytes at
    their peak (the last stage's: `loss_bytes`), and the buffers ZeRO-2/3 stage and gather (`buffer_bytes`). Under
    context parallelism ZeRO shards over dp×cp and the activations are those of each rank's s/cp tokens, with the
    ring's attention core."""
    return _categories(config, pp_rank)[0]


def predicted_memory(config: dict[str, Any]) -> tuple[dict[str, float], float, int]:
    """The rank that pays the most: its categories (`predicted_bytes`), the simultaneous peak of their sum,
    and its pipeline rank. The one memory model: the estimator (and so compare, the planner and the
    notebooks) takes its memory from here, as summary.json does.

    The peak: model states, plus the largest of the activations with the zero-bubble W stash held at the
    same time (they peak at the end of forward or, in a pipeline, when the schedule holds the most
    micro-batches), the activations at the start of the loss's backward with the loss's own bytes (`loss_bytes`:
    the logits, their gradient and a block — on the last stage, where the step's true peak usually falls), the
    gradient
    copies in flight (they peak during backward, as activations are released) and the fp32 copies of
    16-bit gradients (at the update, activations gone), plus the other temporaries (ZeRO-3's gathered
    layers)."""
    best: tuple[dict[str, float], float, int] | None = None
    for rank in range(config.get("pp", 1)):
        categories, total = predicted_total(config, rank)
        if best is None or total > best[1]:
            best = (categories, total, rank)
    assert best is not None
    return best


def predicted_total(config: dict[str, Any], pp_rank: int = 0) -> tuple[dict[str, float], float]:
    """Pipeline rank `pp_rank`'s categories and the most it holds at once (`predicted_memory`'s peak): what
    summary.json puts beside the allocator's true peak (`predicted_peak_total_bytes`)."""
    categories, masters, together, at_loss = _categories(config, pp_rank)
    states = categories["parameter"] + categories["gradient"] + categories["optimizer_state"]
    # at the loss's backward nothing else is in flight: no gradient yet, and ZeRO-3 gathers the head again only
    # once the logits' gradient exists (its output's hook), after the loss has let its bytes go
    elsewhere = (
        max(together, categories["comm_buffer"], masters) + categories["temporary"] - masters
    )
    return categories, states + max(elsewhere, at_loss) + data_bytes(config)


def data_bytes(config: dict[str, Any]) -> float:
    """What the data source keeps for the run (under `other`): the synthetic chain's successor table, V × 4 int64
    (engine/batches.py), in host memory — a CPU rank's; a data file is memory-mapped, outside the allocator."""
    synthetic = (
        config.get("data", "synthetic") == "synthetic" and config.get("device", "cpu") == "cpu"
    )
    return 8 * 4 * run_model(config).vocab_size if synthetic else 0.0


def predicted_peak(config: dict[str, Any]) -> tuple[float, dict[str, float], int]:
    """The most a rank holds at once (`predicted_memory`'s peak, the loss's moment included), with that rank's
    categories and its pipeline rank: what a launch checks against the machine's free memory
    (launching/memory_fit.py)."""
    categories, total, rank = predicted_memory(config)
    return total, categories, rank


class ActivationOptions(TypedDict):
    """What the activation formulas (formulas/activations.py) take besides the model and the micro-batch,
    as a run's config sets it: passed on by keyword (`**options`)."""

    bytes_per_value: int
    tp: int
    sequence_parallel: bool
    recompute: str
    device: str
    core: str


def activation_options(config: dict[str, Any], core: str) -> ActivationOptions:
    """The activation formulas' options for a run (`core`: what `cp_local` says its attention core keeps)."""
    rc = config.get("recompute", "none")
    if config.get("attention", "eager") == "sdpa":
        rc = "fused"  # the fused kernel keeps no probabilities (validated: rc none)
    return ActivationOptions(
        bytes_per_value=4 if config.get("precision", "fp32") == "fp32" else 2,
        tp=config.get("tp", 1),
        sequence_parallel=config.get("sequence_parallel", False),
        recompute=rc,
        device=config.get("device", "cpu"),  # the resolved device: CUDA's kernels save other extras
        core=core,
    )


def _categories(
    config: dict[str, Any], pp_rank: int
) -> tuple[dict[str, float], float, float, float]:
    """`predicted_bytes`; the fp32 copies of 16-bit gradients the update makes (inside `temporary`); the
    most activations and W stash held at once (the two peak at different actions of a zero-bubble
    schedule); and what activations, stash and the loss hold at the loss's peak (0 off the last stage)."""
    model = run_model(config)
    acts, core = cp_local(model, config.get("cp", 1), config.get("cp_rotate", "ring"))
    options = activation_options(config, core)
    width, tp = options["bytes_per_value"], options["tp"]
    states, masters = _state_categories(config, model, pp_rank)
    m = config.get("microbatches", 1)
    micro = config["global_batch"] // config["dp"] // m
    loss = loss_bytes(acts, micro, width, tp)
    # saved until the loss's backward unpacks them
    logits = width * acts.seq_len * micro * (acts.vocab_size // tp)
    if config.get("pp", 1) == 1 and m == 1:
        act = activation_bytes(acts, micro, **options)
        # a rerun's rise comes later
        kept = stage_activation_bytes(acts, micro, stage=0, stages=1, **options)
        return {**states, "activation": act, "loss": loss}, masters, act, kept - logits + loss
    # pipelined: walk this rank's schedule, adding a microbatch's stage bytes at each forward and
    # releasing them at its backward (after the rise a recomputing backward makes); the peak is what the
    # schedule makes the rank hold at once
    # each stage as the part of the model it holds (DualPipe: part k of p, twice; else stage k of p·v)
    sched = run_schedule(config)
    parts = {k: sched.model_part(k) for k in range(sched.stages)}
    lasts = loss_stages(sched)
    stage_bytes = {
        k: stage_activation_bytes(acts, micro, stage=part, stages=n, **options)
        for k, (part, n) in parts.items()
    }
    extra = {
        k: backward_extra_bytes(acts, micro, last=k in lasts, **options)
        for k in range(sched.stages)
    }
    stash = {
        k: wgrad_stash_bytes(
            acts,
            micro,
            layers=model.layers // n,
            last=k in lasts,
            bytes_per_value=width,
            tp=tp,
            sequence_parallel=options["sequence_parallel"],
        )
        for k, (_, n) in parts.items()
    }
    live = peak = stashed = peak_stash = together = at_loss = 0.0
    for a in sched.actions[pp_rank]:
        if a.kind == "F":
            live += stage_bytes[a.stage]
            peak = max(peak, live)
        elif a.kind in ("B", "I"):
            # the loss's backward starts this one: its logits unpacked, its bytes held
            if a.stage in lasts:
                at_loss = max(at_loss, live + stashed - logits + loss)
            peak = max(peak, live + extra[a.stage])
            together = max(together, live + extra[a.stage] + stashed)
            live -= stage_bytes[a.stage]
        # the zero-bubble split: I stashes each Linear's input and output gradient
        if a.kind in ("I", "W"):
            stashed += stash[a.stage] if a.kind == "I" else -stash[a.stage]
            peak_stash = max(peak_stash, stashed)
        together = max(together, live + stashed)
    holds_loss = any(a.stage in lasts for a in sched.actions[pp_rank])
    return (
        {
            **states,
            "activation": peak,
            "loss": loss if holds_loss else 0.0,
            "wgrad_stash": peak_stash,
        },
        masters,
        together,
        at_loss,
    )


def _state_categories(
    config: dict[str, Any], model: ModelConfig, pp_rank: int
) -> tuple[dict[str, float], float]:
    """The categories besides activations — model states, ZeRO's buffers and temporaries, compression's
    copies — and the fp32 copies of 16-bit gradients the update makes (inside `temporary`)."""
    shards = config["dp"] * config.get("cp", 1)  # the ranks holding the same parameters
    params = params_per_rank(
        model,
        tp=config.get("tp", 1),
        pp=config.get("pp", 1),
        virtual_stages=config.get("virtual_stages", 1),
        pp_rank=pp_rank,
        placement=placement(config),
        ep=config.get("ep", 1),
    )
    states = {
        **zero_states(config, model, params, shards, pp_rank),
        **buffer_bytes(
            model,
            params,
            shards,
            config.get("zero", 0),
            bucket_mb=config.get("bucket_mb", 25.0),
            width=4 if config.get("precision", "fp32") == "fp32" else 2,
            prefetch=config.get("prefetch", True),
            backend_copies=config.get("backend") == "gloo",
        ),
    }
    masters = 4 * params if grad_width(config) < 4 else 0.0
    states["temporary"] += masters  # 16-bit gradients: the update makes fp32 copies of them all
    if config.get("grad_compression", "none") != "none" and shards > 1:
        # every bucket's 16-bit copy, in flight until wait() after backward
        states["comm_buffer"] += 2 * params
    if (
        placement(config) == "dual"
    ):  # DualPipe's twin exchange: the rank's gradients out, the twin's in
        states["comm_buffer"] += 2 * grad_width(config) * params
    return states, masters


def zero_states(
    config: dict[str, Any], model: ModelConfig, params: float, shards: int, pp_rank: int
) -> dict[str, float]:
    """Model states per rank: `model_state_bytes` over the ranks holding the same parameters; under expert
    parallelism with ZeRO the dense slices over dp, the experts' over edp (dp/ep ranks)."""
    ep, zero, precision = (
        config.get("ep", 1),
        config.get("zero", 0),
        config.get("precision", "fp32"),
    )
    offload = bool(config.get("offload_optimizer")) and zero > 0
    if ep == 1 or not zero:
        return model_state_bytes(
            params, shards, zero, precision, grad_bytes=grad_width(config), offload=offload
        )
    whole = params_per_rank(
        model,
        tp=config.get("tp", 1),
        pp=config.get("pp", 1),
        virtual_stages=config.get("virtual_stages", 1),
        pp_rank=pp_rank,
        placement=placement(config),
    )
    # this rank's E/ep experts: the whole model's experts less theirs
    experts = (whole - params) / (ep - 1)
    dense = model_state_bytes(
        params - experts, shards, zero, precision, grad_bytes=grad_width(config), offload=offload
    )
    sharded = model_state_bytes(
        experts, shards // ep, zero, precision, grad_bytes=grad_width(config), offload=offload
    )
    return {k: dense[k] + sharded[k] for k in dense}


def predicted_host_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, float]:
    """ZeRO-Offload's host memory per rank by category (empty without offload): formulas.offload_host_bytes
    of the rank's parameters."""
    if not config.get("offload_optimizer") or not config.get("zero", 0):
        return {}
    model = run_model(config)
    params = params_per_rank(
        model,
        tp=config.get("tp", 1),
        pp=config.get("pp", 1),
        virtual_stages=config.get("virtual_stages", 1),
        pp_rank=pp_rank,
        placement=placement(config),
    )
    return offload_host_bytes(params, config["dp"] * config.get("cp", 1))


def cp_local(model: ModelConfig, cp: int, rotate: str = "ring") -> tuple[ModelConfig, str]:
    """The model as each context-parallel rank's activations see it — its s/cp tokens — and the attention
    core that saves them ("ring", "allgather:CP"; "eager" without context parallelism)."""
    if cp == 1:
        return model, "eager"
    return replace(model, seq_len=model.seq_len // cp), (
        "ring" if rotate == "ring" else f"allgather:{cp}"
    )


def placement(config: dict[str, Any]) -> str:
    """Which rank holds which stage: "v" for ZBV and DualPipeV (and a CSV schedule in a V), "dual" for
    DualPipe, else "loop"."""
    if config.get("pp", 1) == 1:
        return "loop"
    name = str(config.get("schedule", "1f1b"))
    return run_schedule(config).placement if name.startswith("csv:") else placement_of(name)


def loss_stages(s: Schedule) -> set[int]:
    """The stages that end a pipeline and compute the loss: the last, and DualPipe's two (p − 1 and 2p − 1,
    one per copy)."""
    return {k for k in range(s.stages) if s.next_stage(k) is None}


def stage_shape(schedule: str, p: int, m: int, v: int = 1) -> Schedule:
    """A schedule's stages without its actions: which rank holds which stage, which part of the model each
    is (DualPipe: part k of p, in two copies) and the microbatches each runs — what a cost or a byte count
    needs of it, without generating the actions (a CSV schedule is read from its file)."""
    if p == 1:
        return Schedule(name="1f1b", p=1, m=m, v=1)
    if schedule.startswith("csv:"):
        return build_schedule(schedule, p, m, v)
    return Schedule(name=schedule, p=p, m=m, v=v, placement=placement_of(schedule))


def pp_sends(s: Schedule) -> int:
    """The most transfers any rank sends a step: per stage it holds, an activation forward and a gradient
    back per microbatch it runs, where the neighbouring stage is on another rank (a V's turn hands over in
    memory; DualPipe's copies do not meet)."""
    most = 0
    for r in range(s.p):
        sends = 0
        for k in (k for k in range(s.stages) if s.rank_of(k) == r):
            nxt, prev = s.next_stage(k), s.prev_stage(k)
            sends += (nxt is not None and not s.local(k, nxt)) + (
                prev is not None and not s.local(prev, k)
            )
        most = max(most, sends * carried(s))
    return most


def carried(s: Schedule) -> int:
    """Microbatches each stage of the schedule runs: all m, but half in DualPipe (each copy's own)."""
    return sum(s.carries(0, mb) for mb in range(s.m))


def grad_width(config: dict[str, Any]) -> int:
    """Bytes per gradient value: 4 for fp32 runs and for 16-bit ones with fp32 main gradients (the
    default), 2 when a 16-bit run reduces in 16 bits."""
    if (
        config.get("precision", "fp32") == "fp32"
        or config.get("grad_reduce_dtype", "fp32") == "fp32"
    ):
        return 4
    return 2


def run_schedule(config: dict[str, Any]) -> Schedule:
    """The microbatch schedule a run's config (config.json or a RunConfig's dict) executes."""
    pp = config.get("pp", 1)
    name = config.get("schedule", "1f1b") if pp > 1 else "1f1b"
    args = (pp, config.get("microbatches", 1), config.get("virtual_stages", 1))
    return build_schedule(name, *args) if name.startswith("csv:") else _built(name, *args)


@functools.lru_cache(maxsize=512)
def _built(name: str, p: int, m: int, v: int) -> Schedule:
    """A generated schedule, built once (the planner asks for the same ones for many layouts)."""
    return build_schedule(name, p, m, v)


def predicted_comm_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, dict[str, float]]:
    """Bytes per step by op and group: the gradient all-reduce over dp — over dp×cp, the `dp_cp` group, under
    context parallelism — (4 bytes per local parameter) and the loss's one value, where that group has more
    than one rank; the tensor-parallel collectives of the layers; the context-parallel ring's K/V and dK/dV; and for
    pipelines the activations and gradients sent between stages (one b·s/cp·h buffer per microbatch and
    boundary), the loss brought to every stage and the gradient norm's share; DualPipe's twin gradients
    (parallel/twin_grads.py: each rank sends its whole gradient to the rank holding the same parts, once a
    step, on the `pp` group)."""
    model = run_model(config)
    dp, tp, pp, cp = config["dp"], config.get("tp", 1), config.get("pp", 1), config.get("cp", 1)
    v, m, sp = (
        config.get("virtual_stages", 1),
        config.get("microbatches", 1),
        config.get("sequence_parallel", False),
    )
    local = params_per_rank(
        model,
        tp=tp,
        pp=pp,
        virtual_stages=v,
        pp_rank=pp_rank,
        placement=placement(config),
        ep=config.get("ep", 1),
    )
    zero, group = config.get("zero", 0), replica_group(cp)
    wire = 2 if config.get("grad_compression", "none") != "none" else grad_width(config)
    # gradients reduce-scattered, parameters all-gathered (twice for ZeRO-3)
    if zero and dp * cp > 1:
        # ZeRO-2 never keeps a full gradient, so with accumulation every microbatch reduce-scatters
        scatters = m if zero == 2 else 1
        out: dict[str, dict[str, float]] = {
            "all_reduce": {group: 4 + 4},
            "reduce_scatter": {group: 4 * local * scatters},
            "all_gather": {group: 4 * local * (2 if zero == 3 else 1)},
        }
    elif dp * cp > 1:
        out = {"all_reduce": {group: 4 + wire * local}}
    else:  # one replica: no gradient to average and no loss to sum (a group of one rank is not called)
        out = {}
    micro = config["global_batch"] // dp // m
    sched = run_schedule(config) if pp > 1 else None
    mine = [0] if sched is None else [k for k in range(sched.stages) if sched.rank_of(k) == pp_rank]
    # the layers this rank holds, each stage with the microbatches it runs (DualPipe's: half of them)
    layers = sum(model.layers // (1 if sched is None else sched.model_part(k)[1]) for k in mine)
    runs = m if sched is None else carried(sched)
    width = 4 if config.get("precision", "fp32") == "fp32" else 2
    acts, _ = cp_local(model, cp)
    tp_bytes = tp_comm_bytes_per_step(
        acts,
        micro,
        tp,
        sequence_parallel=sp,
        microbatches=runs,
        layers=layers,
        first=sched is None or any(sched.prev_stage(k) is None for k in mine),
        last=sched is None or any(sched.next_stage(k) is None for k in mine),
        bytes_per_value=width,
        recompute=config.get("recompute", "none"),
        grad_bytes=grad_width(config),
        positions=model.seq_len,
    )
    for op, nbytes in tp_bytes.items():
        out.setdefault(op, {})["tp"] = nbytes
    # the dispatch, the counts, experts' gradients over edp (formulas/expert_parallel.py)
    if model.experts:
        moe_comm_bytes(out, config, model, micro=micro, layers=layers, wire=wire, microbatches=runs)
    for op, nbytes in cp_comm_bytes_per_step(
        model.seq_len,
        micro,
        model.kv_dim,
        cp,
        layers=layers,
        microbatches=runs,
        tp=tp,
        width=width,
        rotate=config.get("cp_rotate", "ring"),
        recompute=config.get("recompute", "none") != "none",
    ).items():
        out.setdefault(op, {})["cp"] = nbytes
    # the overflow flag, max: world
    if config.get("precision") == "fp16" and not zero and dp * cp * tp * pp > 1:
        out.setdefault("all_reduce", {})["world"] = 4
    if sched is not None:  # pp > 1
        buffer = micro * acts.seq_len // (tp if sp else 1) * model.hidden * width
        acts_of_rank = sched.actions[pp_rank]  # a V's turn hands over in memory: no transfer there
        out.setdefault("send", {})["pp"] = sum(a.is_send for a in acts_of_rank) * buffer
        out.setdefault("recv", {})["pp"] = sum(a.is_recv for a in acts_of_rank) * buffer
        out.setdefault("all_reduce", {})["pp"] = 4 + 4  # the loss, and the gradient norm's squares
        if (
            sched.placement == "dual"
        ):  # DualPipe: the rank's whole gradients swapped with its twin's
            twin = grad_width(config) * local
            out["send"]["pp"] += twin
            out["recv"]["pp"] += twin
    return out


def run_model(config: dict[str, Any]) -> ModelConfig:
    """The model dimensions of a resolved config.json (a field an older file lacks keeps its default)."""
    keys = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in config["model"].items() if k in keys})
