"""One optimizer step on one rank, over a Strategy built once by `parallelize`:

    ProfilerStep#k ─ forward and backward (DP buckets launch their all-reduces as gradients become
                     ready; a pipeline runs its schedule) ─ gradient sync (wait) ─ optimizer (norm,
                     clip, AdamW) ─ the loss of the global batch (an all-reduce of one number)

Memory counters are taken after forward, after backward and after the optimizer step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.config import RunConfig
from workbench.engine.context import RankContext
from workbench.engine.lr_schedule import lr_at
from workbench.engine.moe import end_step as moe_end
from workbench.engine.moe import start_step as moe_start
from workbench.engine.parallelize import Strategy
from workbench.engine.restart import attempt
from workbench.grid import replica_group
from workbench.measure.device import sync_compute


@dataclass
class StepResult:
    step: int
    loss: float  # mean over the global batch
    lr: float
    grad_norm: float | None  # None when the step was skipped (an fp16 overflow, a gradient anomaly)
    step_time_s: float
    extra: dict[str, Any] = field(default_factory=dict)  # the updater's facts: loss scale, skipped


def train_step(strategy: Strategy, batch: tuple[torch.Tensor, torch.Tensor], step: int) -> StepResult:
    ctx, cfg = strategy.ctx, strategy.ctx.config
    rec, memory = ctx.recorder, ctx.memory
    ctx.comm.start_step(step)
    memory.start_step()
    t0 = time.perf_counter()
    with rec.span(f"ProfilerStep#{step}", "step", "compute", step=step):
        inject_fault(cfg, ctx.rank, step)
        spike = spike_factor(cfg, ctx.rank, step)
        scale = loss_scale(cfg, ctx.rank, step, strategy) * spike
        if strategy.moe is not None:  # the aux loss's gradient joins backward at this scale
            moe_start(strategy.moe, scale / cfg.microbatches)
        loss = strategy.forward_backward.run(*batch, step, scale) * spike
        memory.release_activations()  # backward consumed them: normally nothing is left
        strategy.count_model_states()
        memory.snapshot()
        with rec.span("gradient sync", "wait", "wait", step=step):
            strategy.grad_sync.wait()
        loss_value = global_loss(ctx, loss)  # before the update: the spike check needs it on every rank
        lr = lr_at(step, cfg.lr, cfg.steps, cfg.lr_schedule, cfg.warmup_steps, cfg.min_lr_ratio)
        with rec.span("optimizer", "optimizer", "compute", step=step, lr=lr) as opt_args:
            if strategy.loss_spike is not None and strategy.loss_spike.check(loss_value):
                grad_norm, facts = None, {"skipped": True, "anomaly": "loss spike"}
            else:
                grad_norm = strategy.updater.step(lr, cfg.grad_clip)
                facts = strategy.updater.metrics()
            opt_args.update(facts)
            if strategy.moe is not None:
                facts = {**facts, **moe_end(strategy.moe, strategy.model)}
            strategy.grad_sync.zero_grad()
            sync_compute(ctx.device)
        strategy.count_model_states()
        memory.snapshot()
    ctx.comm.end_step()  # CUDA: the step's communication written with its device times
    return StepResult(step, loss_value, lr, grad_norm, time.perf_counter() - t0, facts)


def spike_factor(cfg: RunConfig, rank: int, step: int) -> float:
    """10 on the rank and step of an injected loss spike (its loss and gradients ×10), else 1."""
    return 10.0 if cfg.fault == "loss-spike" and rank == cfg.fault_rank and step == cfg.fault_step else 1.0


def loss_scale(cfg: RunConfig, rank: int, step: int, strategy: Strategy) -> float:
    """The updater's loss scale, or inf on the rank and step of an injected overflow."""
    if cfg.fault in ("overflow", "nan-grad") and rank == cfg.fault_rank and step == cfg.fault_step:
        # this rank's gradients become inf/NaN: every rank must skip the step
        return float("inf") if cfg.fault == "overflow" else float("nan")
    return strategy.updater.loss_scale


def global_loss(ctx: RankContext, loss: torch.Tensor) -> float:
    """The mean loss of the global batch on every rank: the pipeline's last stage holds it (summed over
    pp), each dp rank its share (averaged over dp; under context parallelism each dp×cp rank its share, of
    equally many tokens)."""
    total = loss.detach().reshape(1).clone()
    if ctx.config.pp > 1:
        ctx.comm.all_reduce(total, "pp", label="loss")
    group = replica_group(ctx.config.cp)
    ctx.comm.all_reduce(total, group, label="loss")
    return total.item() / ctx.groups.size(group)


def inject_fault(cfg: RunConfig, rank: int, step: int) -> None:
    if cfg.fault == "straggle" and rank == cfg.fault_rank and step >= cfg.fault_step:
        time.sleep(cfg.fault_delay_s)  # a slow rank: every other one waits for it at the next collective
    if cfg.fault is None or rank != cfg.fault_rank or step != cfg.fault_step:
        return
    if cfg.fault == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if cfg.fault == "hang":
        time.sleep(10 * cfg.timeout_s)  # the other ranks must time out, not wait forever
    if cfg.fault == "kill" and attempt() == 0:  # no handler runs: what a lost machine does
        os.kill(os.getpid(), signal.SIGKILL)
    # "overflow" is injected into the loss scale of that step (see loss_scale)
