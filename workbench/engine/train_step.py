"""One optimizer step on one rank, over a Strategy built once by `parallelize`:

    ProfilerStep#k ─ data (this rank's rows of step k) ─ forward and backward (DP buckets launch their
                     all-reduces as gradients become ready; a pipeline runs its schedule) ─ gradient sync
                     (wait) ─ optimizer (norm, clip, AdamW) ─ the loss of the global batch (an all-reduce of
                     one number) ─ one read: the loss and the gradient norm, together

A step is *measured* or *fast* (measure/schedule.py): the training loop says which (`measured`), and the
step tells its rank's StepClock as it starts (`TraceRecorder.start_step`): the step's argument is the one
writer of the mode; the recorder, the memory tracker and the device clock read that one owner, and the
step hands its `measured` to what it calls itself (`Strategy.count_model_states`). A measured step also
takes memory snapshots after forward, after backward and after the optimizer step, counts activations
through saved-tensor hooks and synchronises the device at the end of each compute span. A fast step does
none of it: the host runs ahead of the GPU until the step's single read. Both compute the same numbers.

What the step is handed, and by whom: the Strategy (`parallelize`: the model's parts, and the recorder,
communicator, memory tracker and process groups they run with), the batch or its source, the step's
number, and from the training loop (engine/train.py) the run's config — the learning-rate schedule, the
clip, the microbatches, the grid's pp and cp: its one source of the config — and whether the step is
measured. Faults injected for teaching are no part of it: where one is asked, engine/faults.py decorates
the Strategy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.comm.groups import ProcessGroups
from workbench.comm.traced import Communicator
from workbench.config import RunConfig
from workbench.config.grid import replica_group
from workbench.engine.batches import Batch, Batches
from workbench.engine.parallelize import Strategy
from workbench.model.moe import end_step as moe_end
from workbench.model.moe import start_step as moe_start
from workbench.optim.lr_schedule import lr_at


@dataclass(kw_only=True)
class StepResult:
    step: int
    loss: float  # mean over the global batch
    lr: float
    grad_norm: float | None  # None when the step was skipped (an fp16 overflow, a gradient anomaly)
    step_time_s: float
    #: skipped, anomaly, the updater's facts (loss scale)
    extra: dict[str, Any] = field(default_factory=dict)
    measured: bool = True


def train_step(
    strategy: Strategy, batch: Batch | Batches, step: int, *, config: RunConfig, measured: bool
) -> StepResult:
    """Step `step` on `batch` — or on `batch.get(step)` of a Batches (engine/batches.py), made inside the
    step's time (a `data` span), the next step's prepared before the step's read."""
    rec, memory, comm = strategy.recorder, strategy.memory, strategy.comm
    rec.start_step(measured=measured)  # the one writer of the step's mode
    comm.start_step(step)
    memory.start_step()
    replicas = strategy.groups.size(replica_group(config.cp))
    data_bytes = batch.resident_bytes() if isinstance(batch, Batches) else 0
    t0 = time.perf_counter()
    with rec.host_span(f"ProfilerStep#{step}", "step", "compute", step=step, measured=measured):
        if isinstance(batch, Batches):
            with rec.host_span("data", "data", "data", step=step):
                x, y = batch.get(step)
        else:
            x, y = batch
        scale = strategy.updater.loss_scale
        if strategy.moe is not None:  # the aux loss's gradient joins backward at this scale
            moe_start(strategy.moe, scale / config.microbatches)
        loss = strategy.forward_backward.run(x, y, step, scale)
        memory.release_activations()  # backward consumed them: normally nothing is left
        strategy.count_model_states(measured=measured, data_bytes=data_bytes)
        memory.snapshot()
        with rec.span("gradient sync", "wait", "wait", step=step):
            strategy.grad_sync.wait()
        # before the update: the spike check needs it on every rank
        total = global_loss(loss, comm=comm, groups=strategy.groups, config=config)
        lr = lr_at(
            step,
            lr=config.lr,
            steps=config.steps,
            schedule=config.lr_schedule,
            warmup_steps=config.warmup_steps,
            min_lr_ratio=config.min_lr_ratio,
        )
        with rec.span("optimizer", "optimizer", "compute", step=step, lr=lr) as opt_args:
            spiked = strategy.loss_spike is not None and strategy.loss_spike.check(
                read(total, replicas=replicas)[0]
            )
            norm = None if spiked else strategy.updater.step(lr, config.grad_clip)
            facts = {} if spiked else strategy.updater.metrics()
            experts = moe_end(strategy.moe, strategy.model) if strategy.moe is not None else {}
            strategy.grad_sync.zero_grad()
            rec.sync_compute()
        if isinstance(batch, Batches) and batch.device.type == "cuda":  # while the GPU works
            with rec.host_span("data", "data", "data", step=step, for_step=step + 1):
                batch.prepare(step + 1)
        # the step's one host synchronisation
        loss_value, norm_value = read(total, norm, replicas=replicas)
        facts.update(skip_facts(spiked, norm, norm_value))
        # the span's record holds this dict (a fast CUDA span is written at end_step)
        opt_args.update(facts)
        strategy.count_model_states(measured=measured, data_bytes=data_bytes)
        memory.snapshot()
    # CUDA: the step's communication and fast spans written
    comm.end_step(synchronized=not measured)
    return StepResult(
        step=step,
        loss=loss_value,
        lr=lr,
        grad_norm=None if facts["skipped"] else norm_value,
        step_time_s=time.perf_counter() - t0,
        extra={**facts, **experts},
        measured=measured,
    )


def read(
    total: torch.Tensor, norm: torch.Tensor | float | None = None, *, replicas: int
) -> tuple[float, float | None]:
    """The global loss (÷ the `replicas` that summed it) and the gradient norm as numbers: one transfer
    to the host, the one place a fast step waits for the device."""
    if isinstance(norm, torch.Tensor):
        loss, value = torch.stack(
            [total.reshape(()).float(), norm.reshape(()).float().to(total.device)]
        ).tolist()
        return loss / replicas, value
    return total.item() / replicas, None if norm is None else float(norm)


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


def global_loss(
    loss: torch.Tensor, *, comm: Communicator, groups: ProcessGroups, config: RunConfig
) -> torch.Tensor:
    """The summed loss of the global batch on every rank, not read: the pipeline's last stage holds it
    (summed over pp), each dp rank its share (summed over dp; under context parallelism each dp×cp rank
    its share, of equally many tokens — `read` divides by their number). A group of one rank is not
    called."""
    total = loss.detach().reshape(1).clone()
    if config.pp > 1:
        comm.all_reduce(total, "pp", label="loss")
    group = replica_group(config.cp)
    if groups.size(group) > 1:
        comm.all_reduce(total, group, label="loss")
    return total
