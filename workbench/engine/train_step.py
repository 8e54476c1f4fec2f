"""One optimizer step on one rank, over a Strategy built once by `parallelize`:

    ProfilerStep#k ─ data (this rank's rows of step k) ─ forward and backward (DP buckets launch their
                     all-reduces as gradients become ready; a pipeline runs its schedule) ─ gradient sync
                     (wait) ─ optimizer (norm, clip, AdamW) ─ the loss of the global batch (an all-reduce of
                     one number) ─ one read: the loss and the gradient norm, together

A step is *measured* or *fast* (measure/schedule.py). A measured step also takes memory snapshots after
forward, after backward and after the optimizer step, counts activations through saved-tensor hooks and
synchronises the device at the end of each compute span. A fast step does none of it: the host runs
ahead of the GPU until the step's single read. Both compute the same numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.config import RunConfig
from workbench.config.grid import replica_group
from workbench.engine.batches import Batch, Batches
from workbench.engine.context import RankContext
from workbench.engine.faults import corrupt_parameters, inject_fault, loss_scale, spike_factor
from workbench.engine.parallelize import Strategy
from workbench.model.moe import end_step as moe_end
from workbench.model.moe import start_step as moe_start
from workbench.optim.lr_schedule import lr_at


@dataclass
class StepResult:
    step: int
    loss: float  # mean over the global batch
    lr: float
    grad_norm: float | None  # None when the step was skipped (an fp16 overflow, a gradient anomaly)
    step_time_s: float
    extra: dict[str, Any] = field(
        default_factory=dict
    )  # skipped, anomaly, the updater's facts (loss scale)
    measured: bool = True


def train_step(
    strategy: Strategy, batch: Batch | Batches, step: int, measured: bool = True
) -> StepResult:
    """Step `step` on `batch` — or on `batch.get(step)` of a Batches (engine/batches.py), made inside the step's
    time (a `data` span), the next step's prepared before the step's read."""
    ctx, cfg = strategy.ctx, strategy.ctx.config
    rec, memory = ctx.recorder, ctx.memory
    rec.measured = measured
    ctx.comm.start_step(step)
    memory.start_step()
    t0 = time.perf_counter()
    with rec.host_span(f"ProfilerStep#{step}", "step", "compute", step=step, measured=measured):
        batches = batch if isinstance(batch, Batches) else None
        if batches is not None:
            with rec.host_span("data", "data", "data", step=step):
                batch = batches.get(step)
        inject_fault(cfg, ctx.rank, step)
        corrupt_parameters(cfg, ctx.rank, step, strategy.state_params)
        spike = spike_factor(cfg, ctx.rank, step)
        scale = loss_scale(cfg, ctx.rank, step, strategy.updater.loss_scale) * spike
        if strategy.moe is not None:  # the aux loss's gradient joins backward at this scale
            moe_start(strategy.moe, scale / cfg.microbatches)
        loss = strategy.forward_backward.run(*batch, step, scale)
        loss = loss * spike if spike != 1.0 else loss
        memory.release_activations()  # backward consumed them: normally nothing is left
        strategy.count_model_states()
        memory.snapshot()
        with rec.span("gradient sync", "wait", "wait", step=step):
            strategy.grad_sync.wait()
        total = global_loss(ctx, loss)  # before the update: the spike check needs it on every rank
        lr = lr_at(step, cfg.lr, cfg.steps, cfg.lr_schedule, cfg.warmup_steps, cfg.min_lr_ratio)
        with rec.span("optimizer", "optimizer", "compute", step=step, lr=lr) as opt_args:
            spiked = strategy.loss_spike is not None and strategy.loss_spike.check(
                read(total, ctx.groups, cfg)[0]
            )
            norm = None if spiked else strategy.updater.step(lr, cfg.grad_clip)
            facts = {} if spiked else strategy.updater.metrics()
            experts = moe_end(strategy.moe, strategy.model) if strategy.moe is not None else {}
            strategy.grad_sync.zero_grad()
            rec.sync_compute()
        if (
            batches is not None and batches.device.type == "cuda"
        ):  # while the GPU works through the step
            with rec.host_span("data", "data", "data", step=step, for_step=step + 1):
                batches.prepare(step + 1)
        loss_value, norm_value = read(
            total, ctx.groups, cfg, norm
        )  # the step's one host synchronisation
        facts.update(skip_facts(spiked, norm, norm_value))
        opt_args.update(
            facts
        )  # the span's record holds this dict (a fast CUDA span is written at end_step)
        strategy.count_model_states()
        memory.snapshot()
    ctx.comm.end_step(
        synchronized=not measured
    )  # CUDA: the step's communication and fast spans written
    return StepResult(
        step,
        loss_value,
        lr,
        None if facts["skipped"] else norm_value,
        time.perf_counter() - t0,
        {**facts, **experts},
        measured,
    )


def read(
    total: torch.Tensor, groups: Any, cfg: RunConfig, norm: torch.Tensor | float | None = None
) -> tuple[float, float | None]:
    """The global loss (÷ the replicas that summed it) and the gradient norm as numbers: one transfer to
    the host, the one place a fast step waits for the device."""
    n = groups.size(replica_group(cfg.cp))
    if isinstance(norm, torch.Tensor):
        loss, value = torch.stack(
            [total.reshape(()).float(), norm.reshape(()).float().to(total.device)]
        ).tolist()
        return loss / n, value
    return total.item() / n, None if norm is None else float(norm)


def skip_facts(
    spiked: bool, norm: torch.Tensor | float | None, value: float | None
) -> dict[str, Any]:
    """Whether the update was skipped, and why: a loss spike, a non-finite gradient norm (the update saw it
    and changed nothing), or an fp16 overflow (no norm at all: a normal event of loss scaling, no anomaly)."""
    if spiked:
        return {"skipped": True, "anomaly": "loss spike"}
    if norm is None:
        return {"skipped": True, "anomaly": None}
    finite = value is not None and math.isfinite(value)
    return {"skipped": not finite, "anomaly": None if finite else "non-finite gradient norm"}


def global_loss(ctx: RankContext, loss: torch.Tensor) -> torch.Tensor:
    """The summed loss of the global batch on every rank, not read: the pipeline's last stage holds it
    (summed over pp), each dp rank its share (summed over dp; under context parallelism each dp×cp rank its
    share, of equally many tokens — `read` divides by their number). A group of one rank is not called."""
    total = loss.detach().reshape(1).clone()
    if ctx.config.pp > 1:
        ctx.comm.all_reduce(total, "pp", label="loss")
    group = replica_group(ctx.config.cp)
    if ctx.groups.size(group) > 1:
        ctx.comm.all_reduce(total, group, label="loss")
    return total
