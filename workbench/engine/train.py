"""The training loop that runs on every rank: config → rank grid (context.py) → parallelize → steps.

`parallelize` builds the rank's Strategy once (decorated with the run's fault where one is asked:
engine/faults.py); each step is `train_step`, handed the config and whether it is measured. Rank 0
appends one line per step to metrics.jsonl; every rank streams its trace after each step and writes it at
the end (and on failure, by the worker's handlers). The attempt number comes from the worker
(launching/worker.py: the number the group agreed on).
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch

from workbench.config.rules import profile_range
from workbench.engine.anomaly import Divergence
from workbench.engine.batches import Batches
from workbench.engine.checkpoint.save_load import maybe_save, resume_step
from workbench.engine.context import RankContext, write_json, write_resolved_config
from workbench.engine.evaluate import due, evaluate
from workbench.engine.faults import Fault, with_fault
from workbench.engine.logs.tensorboard import StepLogs, TensorBoard
from workbench.engine.logs.wandb_log import WandB
from workbench.engine.parallelize import Strategy, parallelize
from workbench.engine.restart import trim_metrics
from workbench.engine.train_step import StepResult, train_step
from workbench.measure.gpu_health import GpuHealth, record
from workbench.measure.schedule import MeasureSchedule, measure_schedule
from workbench.measure.torch_profile import TorchProfile
from workbench.pipeline.stages import global_name
from workbench.trace import strict_json
from workbench.trace.disk import writing


def train(ctx: RankContext, *, attempt: int) -> dict[str, Any]:
    """Run the configured steps of attempt `attempt` (0: the first; engine/restart.py); return rank-local
    results (median step time, final loss)."""
    cfg, mcfg = ctx.config, ctx.config.model_config
    profile = ctx.memory_profile
    if profile is not None:  # started before the model exists: the allocator's total is the rank's
        profile.start()
    strategy = parallelize(cfg, ctx)
    fault = Fault.asked(cfg, rank=ctx.rank, attempt=attempt)
    # injection wraps the step, on the fault's rank only; elsewhere there is none
    if fault is not None:
        strategy = with_fault(strategy, fault, microbatches=cfg.microbatches)
    describe(strategy, ctx)
    dp_index, dp_size = ctx.groups.index("dp"), ctx.groups.size("dp")
    results: list[StepResult] = []
    start = resume_step(strategy, config=cfg, run_dir=ctx.run_dir)
    if ctx.rank == 0:
        trim_metrics(ctx.run_dir, start, attempt=attempt)
    source = Batches(cfg, ctx.device, dp_index=dp_index, dp_size=dp_size, cp=strategy.context)
    schedule = measured_steps(ctx)
    logs = step_logs(ctx)
    kineto = (
        TorchProfile(
            ctx.run_dir, ctx.rank, ctx.recorder, ctx.device, profile_range(cfg.profile_steps)
        )
        if cfg.profile_steps
        else None
    )
    health = GpuHealth.open(ctx.device) if cfg.gpu_health_every else None
    divergence = Divergence(max_skipped=cfg.max_skipped_steps, lr=cfg.lr)
    held_out = (
        Batches(
            cfg, ctx.device, dp_index=dp_index, dp_size=dp_size, cp=strategy.context, part="val"
        )
        if cfg.eval_every
        else None
    )
    for step in range(start, cfg.steps):
        step_start = ctx.recorder.now_us()
        if kineto is not None:
            kineto.before(step)
        measured = schedule.measured(step)
        results.append(train_step(strategy, source, step, config=cfg, measured=measured))
        # each rank's attention work, per layer: the balance, measured
        if strategy.context is not None:
            ctx.recorder.info["cp_pairs"] = dict(strategy.context.pairs)
        if kineto is not None:
            kineto.after(step)
        if profile is not None and step == cfg.profile_memory_step:
            ctx.memory.record_allocator(profile.stop(), since_us=step_start)
        if health is not None and step % cfg.gpu_health_every == 0:
            results[-1].extra["gpu"] = record(health, ctx.recorder, ctx.run_dir, ctx.rank, step)
        # forward only, every rank
        if held_out is not None and due(step, cfg.eval_every, cfg.steps):
            results[-1].extra["val_loss"] = evaluate(strategy, held_out, step, config=cfg)
        if ctx.rank == 0:
            row = append_metrics(ctx, results[-1], attempt=attempt)
            if logs is not None:
                logs.write(row, since_us=step_start)
        ctx.recorder.flush()
        # a run that cannot recover stops here, its files kept (every rank at the same step)
        r = results[-1]
        suspect = r.extra.get("anomaly") == "non-finite gradient norm"
        divergence.observe(step, r.loss, r.extra, parameters_finite(strategy) if suspect else None)
        maybe_save(strategy, step, config=cfg, run_dir=ctx.run_dir)
    ctx.comm.end_step()  # CUDA: spans deferred past the last step's end (its evaluation) given their device times
    ctx.recorder.flush()
    return {
        "step_time_s": statistics.median(r.step_time_s for r in results) if results else None,
        "loss": results[-1].loss if results else float("nan"),
        "memory_peaks": ctx.memory.peaks(),
        "params": mcfg.param_count(),
        "logs": logs,
    }


def parameters_finite(strategy: Strategy) -> bool:
    """Whether every rank's parameters (or ZeRO-3 slices) are finite — a collective: every rank asks it at the
    same skipped step. Only after a skip: a pass over the parameters and a wait for the device."""
    tensors = [p.detach() for p in strategy.state_params if p.numel()]
    bad = torch.zeros(1, device=strategy.device)
    if tensors:
        bad += torch.stack(torch._foreach_norm(tensors)).isfinite().logical_not().any()
    if strategy.groups.size("world") > 1:
        strategy.comm.all_reduce(bad, "world", label="parameters finite", reduce_op="max")
    return not bool(bad.item())


def step_logs(ctx: RankContext) -> StepLogs | None:
    """Rank 0's loggers (TensorBoard, W&B), or None when none was asked for; the worker closes them once
    summary.json exists (W&B attaches it)."""
    cfg = ctx.config
    if ctx.rank != 0 or not (cfg.tensorboard or cfg.wandb):
        return None
    loggers = ([TensorBoard(ctx.run_dir)] if cfg.tensorboard else []) + (
        [WandB(ctx.run_dir, cfg.wandb, cfg.to_dict())] if cfg.wandb else []
    )
    return StepLogs(ctx.recorder, ctx.memory, loggers)


def measured_steps(ctx: RankContext) -> MeasureSchedule:
    """Which steps this rank measures (measure/schedule.py), written into its trace (summary.json says which
    steps each figure comes from). The CPU memory profile's step is always measured: it reads the
    snapshots' marks."""
    cfg = ctx.config
    also = (cfg.profile_memory_step,) if cfg.profile_memory and ctx.device.type != "cuda" else ()
    schedule = measure_schedule(
        cfg.measure,
        steps=cfg.steps,
        device_type=ctx.device.type,
        warmup_excluded=cfg.warmup_steps_excluded,
        trace=cfg.trace,
        also=also,
    )
    ctx.recorder.info["measured_steps"] = schedule.describe()
    return schedule


def describe(strategy: Strategy, ctx: RankContext) -> None:
    """Before the first step: parameter shapes into the trace, config.json (and schedule.json) from
    rank 0, the model states' first memory snapshot. The whole context: config.json says what this
    launch resolved (engine/context.write_resolved_config)."""
    ctx.recorder.info["param_shapes"] = {
        global_name(n): list(p.shape) for n, p in strategy.model.named_parameters()
    }
    if ctx.rank == 0:
        write_resolved_config(
            ctx,
            ctx.config.model_config.param_count(),
            sum(p.numel() for p in strategy.model.parameters()),
        )
        if strategy.schedule is not None:
            write_json(os.path.join(ctx.run_dir, "schedule.json"), strategy.schedule.to_dict())
    strategy.count_model_states(measured=True)  # start-up is measured (trace/step_clock.py)
    ctx.memory.snapshot()


def append_metrics(ctx: RankContext, r: StepResult, *, attempt: int) -> dict[str, Any]:
    tokens = ctx.config.global_batch * ctx.config.model_config.seq_len
    row: dict[str, Any] = {
        "step": r.step,
        "loss": r.loss,
        "lr": r.lr,
        "grad_norm": r.grad_norm,
        "step_time_s": r.step_time_s,
        "tokens": tokens,
        "tokens_per_s": tokens / r.step_time_s,
        "attempt": attempt,
        "world_size": ctx.world_size,
        "measured": r.measured,
    }
    row.update(
        r.extra if ctx.config.precision == "fp16" else {"skipped": r.extra.get("skipped", False)}
    )
    row["anomaly"] = r.extra.get("anomaly")
    if "gpu" in r.extra:  # rank 0's GPU (measure/gpu_health.py; every rank's in gpu_health.jsonl)
        row["gpu"] = {k: v for k, v in r.extra["gpu"].items() if k != "anomaly"}
        row["anomaly"] = row["anomaly"] or r.extra["gpu"]["anomaly"]
    # held-out loss; experts (model/moe.py)
    for key in (
        "val_loss",
        "tokens_per_expert",
        "dropped_tokens",
    ):
        if key in r.extra:
            row[key] = r.extra[key]
    path = os.path.join(ctx.run_dir, "metrics.jsonl")
    with writing(path, f"the metrics of step {r.step}"), open(path, "a") as f:
        f.write(strict_json.dumps(strict_json.row(row)) + "\n")  # NaN as null, named in `nonfinite`
    return row
