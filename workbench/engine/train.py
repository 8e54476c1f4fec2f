"""The training loop that runs on every rank: config → rank grid → model → gradient sync → steps.

One optimizer step:

    ProfilerStep#k ─ forward (activations counted) ─ backward (DP buckets launch their all-reduces
                     as gradients become ready) ─ finish gradient sync (wait) ─ clip ─ AdamW
                     ─ loss of the global batch (an all-reduce of one number over dp)

Memory counters are taken after forward, after backward and after the optimizer step. Rank 0 appends
one line per step to metrics.jsonl; every rank writes its trace at the end (and on failure, by the
worker's handlers).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workbench.comm.traced import Communicator
from workbench.config import RunConfig
from workbench.engine.data import global_batch, shard_rows
from workbench.engine.device import sync_compute
from workbench.engine.lr_schedule import lr_at
from workbench.engine.memory import MemoryTracker
from workbench.engine.mixed_precision import DTYPES, MixedPrecisionOptimizer
from workbench.engine.model import GPT
from workbench.engine.recompute import Recompute
from workbench.grid import ProcessGroups, RankGrid
from workbench.parallel.data_parallel import BucketedDataParallel, NaiveDataParallel
from workbench.parallel.tensor_parallel import TensorParallelGrads
from workbench.parallel.tensor_parallel import grad_norm as tp_grad_norm
from workbench.parallel.tp_communications import TPContext
from workbench.parallel.zero import ZeroDataParallel
from workbench.parallel.zero3 import Zero3DataParallel, gpt_units
from workbench.pipeline.executor import PipelineExecutor
from workbench.pipeline.schedule import build_schedule
from workbench.pipeline.stages import build_stages
from workbench.trace.recorder import TraceRecorder


@dataclass
class RankContext:
    """What one rank needs, built once and passed explicitly."""

    config: RunConfig
    run_dir: str
    rank: int
    world_size: int
    backend: str
    device: torch.device
    grid: RankGrid
    groups: ProcessGroups
    recorder: TraceRecorder
    memory: MemoryTracker
    comm: Communicator
    hosts: list[str]


def resolve_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def setup(config: RunConfig, run_dir: str) -> RankContext:
    """Join the process group (with the config's timeout), build the grid, agree on the clock."""
    backend = resolve_backend(config.backend)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size != config.world_size:
        raise RuntimeError(
            f"torchrun started {world_size} processes but dp×tp×pp = {config.dp}×{config.tp}×{config.pp} "
            f"= {config.world_size}: launch with --nproc-per-node × --nnodes = {config.world_size}"
        )
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=config.timeout_s),
                            device_id=device if backend == "nccl" else None)
    grid = RankGrid(dp=config.dp, tp=config.tp, pp=config.pp)
    groups = ProcessGroups.create(grid, rank, config.timeout_s)
    name = config.name or os.path.basename(os.path.abspath(run_dir))
    recorder = TraceRecorder(rank, world_size, backend, grid.coords(rank), name, enabled=config.trace)
    memory = MemoryTracker(recorder, device)
    comm = Communicator(groups, recorder, memory)
    # Clock agreement: t = 0 is the exit of this barrier on every rank; record wall-clock offsets.
    comm.barrier()
    recorder.set_epoch()
    walls: list[Any] = [None] * world_size
    dist.all_gather_object(walls, (time.time_ns(), socket.gethostname()))
    recorder.clock_offset_us = (walls[rank][0] - walls[0][0]) / 1000.0
    return RankContext(config, run_dir, rank, world_size, backend, device, grid, groups, recorder, memory, comm,
                       hosts=[w[1] for w in walls])


def write_resolved_config(ctx: RankContext, params: int, params_per_rank: int) -> None:
    cfg = ctx.config
    resolved = {
        **cfg.to_dict(),
        "model": {"preset": cfg.model if isinstance(cfg.model, str) else None,
                  **cfg.model_config.__dict__},
        "params": params,
        "params_per_rank": params_per_rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "local_batch": cfg.local_batch,
        "torch_version": torch.__version__,
        "hosts": ctx.hosts,
        "grid": {r: ctx.grid.coords(r) for r in range(ctx.world_size)},
    }
    _write_json(os.path.join(ctx.run_dir, "config.json"), resolved)


def _write_json(path: str, obj: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def inject_fault(cfg: RunConfig, rank: int, step: int) -> None:
    if cfg.fault is None or rank != cfg.fault_rank or step != cfg.fault_step:
        return
    if cfg.fault == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if cfg.fault == "hang":
        time.sleep(10 * cfg.timeout_s)  # the other ranks must time out, not wait forever
    # "overflow" is injected into the loss scale of that step (see train)


def train(ctx: RankContext) -> dict[str, Any]:
    """Run the configured steps; return rank-local results (step times, final loss)."""
    cfg, rec, memory, comm = ctx.config, ctx.recorder, ctx.memory, ctx.comm
    mcfg = cfg.model_config
    torch.manual_seed(cfg.seed)
    if cfg.offload_optimizer:
        if ctx.device.type != "cuda":
            note = "optimizer offload is a no-op here: on a CPU run the optimizer already lives in host memory"
            rec.info["offload_optimizer"] = note
            if ctx.rank == 0:
                print(f"[workbench] {note}", flush=True)
        else:
            raise NotImplementedError("optimizer offload to host memory is not built yet for CUDA runs")
    tp = None
    if cfg.tp > 1:
        tp = TPContext(comm, ctx.groups.index("tp"), ctx.groups.size("tp"), cfg.sequence_parallel)
    recompute = Recompute(cfg.recompute, rec, memory) if cfg.recompute != "none" else None
    executor = None
    pipelined = cfg.pp > 1 or cfg.microbatches > 1  # pipeline stages (or gradient accumulation, pp = 1)
    if pipelined:
        schedule = build_schedule(cfg.schedule if cfg.pp > 1 else "1f1b", cfg.pp, cfg.microbatches,
                                  cfg.virtual_stages)
        chunks = build_stages(mcfg, schedule, ctx.groups.index("pp"), cfg.seed, tp, ctx.device, recompute)
        model: torch.nn.Module = torch.nn.ModuleDict({str(k): c for k, c in chunks.items()})
    else:
        with torch.device(ctx.device):  # parameters are created on the device, one full tensor at a time
            model = GPT(mcfg, seed=cfg.seed, tp=tp, recompute=recompute)
    if cfg.precision != "fp32":  # 16-bit parameters (and so activations and gradients)
        model.to(DTYPES[cfg.precision])
    params = list(model.parameters())
    n_params = mcfg.param_count()
    rec.info["param_shapes"] = {_full_name(name): list(p.shape) for name, p in model.named_parameters()}
    if ctx.rank == 0:
        write_resolved_config(ctx, n_params, sum(p.numel() for p in params))
        if pipelined:
            _write_json(os.path.join(ctx.run_dir, "schedule.json"), schedule.to_dict())
    tp_grads = TensorParallelGrads(model, tp) if tp is not None else None
    if cfg.zero == 3:
        sync: Any = Zero3DataParallel(gpt_units(model), comm, cfg.lr, cfg.weight_decay, cfg.prefetch)
    elif cfg.zero in (1, 2):
        sync = ZeroDataParallel(model, comm, cfg.zero, cfg.bucket_mb, cfg.lr, cfg.weight_decay)
    elif cfg.dp_impl == "naive":
        sync = NaiveDataParallel(model, comm)
    else:
        sync = BucketedDataParallel(model, comm, cfg.bucket_mb, cfg.allreduce)
    if pipelined:
        micro = cfg.local_batch // cfg.microbatches
        seq = mcfg.seq_len // (cfg.tp if cfg.sequence_parallel else 1)
        executor = PipelineExecutor(schedule, ctx.groups.index("pp"), chunks, comm, memory,
                                    (micro, seq, mcfg.hidden), ctx.device, sync,
                                    DTYPES.get(cfg.precision, torch.float32))
    mixed = None
    if cfg.zero:  # the optimizer updates only this rank's partition
        optimizer = sync.optimizer
    elif cfg.precision != "fp32":  # fp32 master weights and moments, 16-bit model
        mixed = MixedPrecisionOptimizer(params, comm, cfg.precision, cfg.lr, cfg.weight_decay,
                                        cfg.loss_scale_init, cfg.loss_scale_growth_interval)
        optimizer = mixed
    else:
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
    state_params = sync.param_tensors() if cfg.zero == 3 else params  # what the parameter category holds
    masters = mixed.state_tensors() if mixed is not None else []
    memory.register_model(model)
    memory.count_model_states(state_params, optimizer, sync.grad_tensors(), masters)
    memory.snapshot()

    dp_index, dp_size = ctx.groups.index("dp"), ctx.groups.size("dp")
    metrics_path = os.path.join(ctx.run_dir, "metrics.jsonl")
    step_times: list[float] = []
    loss_value = float("nan")
    for step in range(cfg.steps):
        comm.step = step
        t0 = time.perf_counter()
        with rec.span(f"ProfilerStep#{step}", "step", "compute", step=step):
            inject_fault(cfg, ctx.rank, step)
            x, y = global_batch(cfg.seed, step, cfg.global_batch, mcfg.seq_len, mcfg.vocab_size)
            x, y = shard_rows(x, dp_index, dp_size).to(ctx.device), shard_rows(y, dp_index, dp_size).to(ctx.device)
            scale = mixed.scale if mixed is not None else 1.0
            if cfg.fault == "overflow" and ctx.rank == cfg.fault_rank and step == cfg.fault_step:
                scale = float("inf")  # an injected overflow: this rank's gradients become inf/NaN
            if executor is not None:
                executor.loss_scale = scale
                # each microbatch a tensor of its own, so a forward keeps only its own ids alive
                xs, ys = ([t.clone() for t in z.chunk(cfg.microbatches)] for z in (x, y))
                loss = executor.run(xs, ys, step)
            else:
                with rec.span("forward", "forward", "compute", step=step, microbatch=0):
                    with memory.count_saved_activations():
                        loss = model(x, y)
                    sync_compute(ctx.device)
                memory.snapshot()
                with rec.span("backward", "backward", "compute", step=step, microbatch=0):
                    (loss * scale if scale != 1.0 else loss).backward()
                    sync_compute(ctx.device)
            memory.set("activation", 0)
            memory.count_model_states(state_params, optimizer, sync.grad_tensors(), masters)
            memory.snapshot()
            with rec.span("gradient sync", "wait", "wait", step=step):
                sync.finish()
                if tp_grads is not None:
                    tp_grads.finish()
            lr = lr_at(step, cfg.lr, cfg.steps, cfg.lr_schedule, cfg.warmup_steps, cfg.min_lr_ratio)
            for group in optimizer.param_groups:
                group["lr"] = lr
            with rec.span("optimizer", "optimizer", "compute", step=step, lr=lr) as opt_args:
                if mixed is not None:
                    grad_norm = mixed_precision_step(mixed, cfg.grad_clip, tp, comm if cfg.pp > 1 else None)
                    opt_args.update(loss_scale=mixed.scale, skipped=mixed.skipped)
                elif cfg.zero:
                    grad_norm = clip_sharded(sync, cfg.grad_clip, comm if cfg.pp > 1 else None)
                    sync.step()  # AdamW on this rank's partition, then all-gather the parameters
                else:
                    grad_norm = clip_grad_norm(params, cfg.grad_clip, tp, comm if cfg.pp > 1 else None)
                    optimizer.step()
                sync.zero_grad()
                sync_compute(ctx.device)
            memory.count_model_states(state_params, optimizer, sync.grad_tensors(), masters)
            memory.snapshot()
            loss_sum = loss.detach().reshape(1).clone()
            if cfg.pp > 1:  # the loss lives on the last stage: bring it to every stage
                comm.all_reduce(loss_sum, "pp", label="loss")
            comm.all_reduce(loss_sum, "dp", label="loss")
            loss_value = loss_sum.item() / dp_size
        dt = time.perf_counter() - t0
        step_times.append(dt)
        rec.flush()
        if ctx.rank == 0:
            tokens = cfg.global_batch * mcfg.seq_len
            norm = grad_norm if grad_norm == grad_norm else None  # a skipped step has no gradient norm
            row = {"step": step, "loss": loss_value, "lr": optimizer.param_groups[0]["lr"], "grad_norm": norm,
                   "step_time_s": dt, "tokens": tokens, "tokens_per_s": tokens / dt}
            if mixed is not None and cfg.precision == "fp16":
                row.update(loss_scale=mixed.scale, skipped=mixed.skipped)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
    return {"step_time_s": statistics.median(step_times) if step_times else None, "loss": loss_value,
            "memory_peaks": memory.peaks(), "params": n_params}


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float | None, tp: TPContext | None,
                   pp_comm: Communicator | None = None) -> float:
    """The norm of the whole model's gradient (shards summed over tp, stages over pp) and, with
    max_norm, the same scaling as torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6),
    at most 1)."""
    total = tp_grad_norm(params, tp, pp_comm)
    if max_norm is not None:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return float(total)


def mixed_precision_step(mixed: MixedPrecisionOptimizer, max_norm: float | None, tp: TPContext | None,
                         pp_comm: Communicator | None) -> float:
    """Skip on overflow (halving the fp16 scale); else unscale into the fp32 masters, clip, update."""
    if mixed.found_overflow():
        mixed.update_scale(True)
        return float("nan")
    mixed.unscaled_master_grads()
    total = tp_grad_norm(mixed.masters, tp, pp_comm)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0) if max_norm is not None else None
    mixed.step(coef)
    mixed.update_scale(False)
    return float(total)


def clip_sharded(sync: Any, max_norm: float | None, pp_comm: Communicator | None) -> float:
    """Gradient norm and clipping when each rank holds only its partition of the gradient (ZeRO)."""
    sq = sync.grad_norm_sq()
    if pp_comm is not None:
        sq = sq.reshape(1).clone()
        pp_comm.all_reduce(sq, "pp", label="grad norm")
        sq = sq[0]
    total = sq.sqrt()
    if max_norm is not None:
        sync.clip(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return float(total)


def _full_name(name: str) -> str:
    """A pipeline chunk's parameter name without its ModuleDict key ("3.blocks.5.ln_1.weight" →
    "blocks.5.ln_1.weight"): the whole model's name."""
    head, _, rest = name.partition(".")
    return rest if head.isdigit() and rest else name
