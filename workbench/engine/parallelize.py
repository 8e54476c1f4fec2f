"""Build, once, everything one rank needs to train: its `Strategy` (torchtitan's parallelize step).

    dense GPT, on the meta device (nothing allocated)            model/gpt.py
      → tensor-parallel module swap                              parallel/tensor_parallel.apply_tensor_parallel
      → context parallelism: ring attention, this rank's positions parallel/context_parallel.ContextParallel
      → expert parallelism: this ep rank's experts, the dispatcher   parallel/expert_parallel.py, model/moe.py
      → materialise on the device, initialise by parameter name  GPT.init_weights
      → activation recomputation                                 engine/recompute.apply_recompute
      → precision (16-bit parameters and activations)
      → torch.compile of each transformer block (--compile)        engine/compiled.py
    (one such chunk per pipeline stage of this rank, `pipeline/stages.py`)
      → gradient sync: ZeRO-3 | ZeRO-1/2 | bucketed | naive DP (+ TP partial gradients)   a GradSync
        (over dp, or dp×cp — the `dp_cp` group — under context parallelism; experts over edp when ep > 1)
        (a 16-bit model's gradients in fp32 main_grad buckets unless grad_reduce_dtype says 16 bits)
      → updater: sharded AdamW (ZeRO; on the host with offload) | mixed precision | AdamW  an Updater
      → forward/backward: the pipeline executor running the schedule, or one batch

The training step (`engine/train_step.py`) then only calls the pieces: forward_backward.run →
grad_sync.wait → updater.step → grad_sync.zero_grad.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.config import RunConfig
from workbench.config.grid import replica_group
from workbench.engine.anomaly import LossSpike
from workbench.engine.compiled import compile_blocks
from workbench.engine.context import RankContext
from workbench.engine.forward_backward import ForwardBackward, SingleBatch
from workbench.engine.recompute import Recompute, apply_recompute
from workbench.model.gpt import GPT, CausalSelfAttention
from workbench.model.moe import MoE, MoEState
from workbench.optim.mixed_precision import DTYPES, MixedPrecisionUpdater
from workbench.optim.offload import OffloadedAdamWUpdater
from workbench.optim.onebit_adam import OneBitAdamUpdater
from workbench.optim.updater import AdamHyper, AdamWUpdater, ShardedAdamWUpdater, Updater
from workbench.optim.weight_decay import mark_decay
from workbench.parallel.context_parallel import ContextParallel
from workbench.parallel.data_parallel import BucketedDataParallel, NaiveDataParallel
from workbench.parallel.expert_parallel import ExpertParallel, expert_params, shard_experts
from workbench.parallel.grad_sync import ChainedGradSync, GradSync
from workbench.parallel.tensor_parallel import TensorParallelGrads, apply_tensor_parallel
from workbench.parallel.tp_communications import TPContext
from workbench.parallel.zero import ZeroDataParallel, ZeroGroups
from workbench.parallel.zero3 import Zero3DataParallel, gpt_units
from workbench.pipeline.executor import PipelineExecutor
from workbench.pipeline.stages import build_stages
from workbench.schedules.build import Schedule, build_schedule


@dataclass
class Strategy:
    """One rank's assembled training: what `train_step` runs."""

    ctx: RankContext
    model: nn.Module  # the whole model, or a ModuleDict of this rank's pipeline chunks
    grad_sync: GradSync
    updater: Updater
    forward_backward: ForwardBackward
    state_params: list[torch.Tensor]  # what the `parameter` memory category holds
    schedule: Schedule | None = None  # when the step runs a microbatch schedule
    loss_spike: LossSpike | None = None  # skips a step whose loss jumps (engine/anomaly.py)
    context: ContextParallel | None = (
        None  # cp > 1: shards each batch's sequence, counts attention work
    )
    moe: MoEState | None = None  # a model with experts: the MoE layers' shared state (model/moe.py)

    def count_model_states(self) -> None:
        """Re-count parameters, gradients and optimizer state (a measured step's)."""
        if not self.ctx.recorder.measured:
            return
        self.ctx.memory.count_model_states(
            self.state_params,
            self.grad_sync.grad_tensors(),
            self.updater.state_tensors(),
            self.updater.counter_tensors(),
        )
        if host := self.updater.host_tensors():  # ZeRO-Offload: what the host holds
            self.ctx.memory.count_host(host)


def runs_schedule(cfg: RunConfig) -> bool:
    """Pipeline stages, or gradient accumulation (a one-stage schedule of microbatches)."""
    return cfg.pp > 1 or cfg.microbatches > 1


@dataclass
class ChunkParts:
    """What every chunk of the model (the whole model, or each pipeline stage of it) is built with: the
    tensor-parallel context, recomputation, context parallelism and the experts' shared state (None: off)."""

    tp: TPContext | None
    recompute: Recompute | None
    cp: ContextParallel | None
    moe: MoEState | None

    @classmethod
    def of(cls, cfg: RunConfig, ctx: RankContext) -> ChunkParts:
        tp = None
        if cfg.tp > 1:
            tp = TPContext(
                ctx.comm, ctx.groups.index("tp"), ctx.groups.size("tp"), cfg.sequence_parallel
            )
        recompute = (
            Recompute(cfg.recompute, ctx.recorder, ctx.memory) if cfg.recompute != "none" else None
        )
        cp = None
        if cfg.cp > 1:
            cp = ContextParallel(ctx.comm, cfg.model_config.seq_len, cfg.cp_balance, cfg.cp_rotate)
        return cls(tp, recompute, cp, moe_state(cfg, ctx.comm))


def parallelize(cfg: RunConfig, ctx: RankContext) -> Strategy:
    """This rank's Strategy, built once: the model's chunks, then data parallelism, the updater and how a
    step's forwards and backwards run (the module's docstring draws the order)."""
    torch.manual_seed(cfg.seed)
    parts = ChunkParts.of(cfg, ctx)
    schedule, chunks = None, None
    if runs_schedule(cfg):
        schedule = build_schedule(
            cfg.schedule if cfg.pp > 1 else "1f1b", cfg.pp, cfg.microbatches, cfg.virtual_stages
        )

        def stage(layers: range, first: bool, last: bool) -> GPT:
            return build_chunk(cfg, ctx, parts, layers, first, last)

        chunks = build_stages(cfg.model_config.layers, schedule, ctx.groups.index("pp"), stage)
        model: nn.Module = nn.ModuleDict({str(k): c for k, c in chunks.items()})
    else:
        model = build_chunk(cfg, ctx, parts)
    grad_sync = wrap_data_parallel(cfg, ctx, model, parts.tp)
    updater = build_updater(cfg, ctx, model, grad_sync, parts.tp)
    if schedule is not None:
        forward_backward: ForwardBackward = pipeline_executor(cfg, ctx, schedule, chunks, grad_sync)
    else:
        forward_backward = SingleBatch(model, ctx.recorder, ctx.memory, ctx.device)
    state_params = grad_sync.shards if cfg.zero == 3 else list(model.parameters())  # type: ignore[attr-defined]
    ctx.memory.register_model(model)
    return Strategy(
        ctx=ctx,
        model=model,
        grad_sync=grad_sync,
        updater=updater,
        forward_backward=forward_backward,
        state_params=state_params,
        schedule=schedule,
        loss_spike=LossSpike(cfg.loss_spike_factor) if cfg.loss_spike_factor > 0 else None,
        context=parts.cp,
        moe=parts.moe,
    )


def build_chunk(
    cfg: RunConfig,
    ctx: RankContext,
    parts: ChunkParts,
    layers: range | None = None,
    first: bool = True,
    last: bool = True,
) -> GPT:
    """The model (or one pipeline stage of it): dense on meta → TP swap → experts sharded → device, init by
    name → recompute → attention's kernel and context parallelism → precision → compile."""
    with torch.device("meta"):
        chunk = GPT(cfg.model_config, layers=layers, first=first, last=last)
    if parts.tp is not None:
        apply_tensor_parallel(chunk, parts.tp)
    if cfg.ep > 1:
        shard_experts(chunk, ctx.groups.index("ep"), cfg.ep)
    materialize(chunk, ctx.device)
    chunk.tie()  # materialising made new parameters: the head takes the token table again
    mark_decay(
        chunk, cfg.decay_embeddings
    )  # which parameters weight decay shrinks (before ZeRO flattens them)
    chunk.init_weights(cfg.seed)
    if parts.recompute is not None:
        apply_recompute(chunk, parts.recompute)
    if last:  # the loss tells the tracker its bytes at their peak (model/cross_entropy.py)
        chunk.loss.memory = ctx.memory
    for attn in (m for m in chunk.modules() if isinstance(m, CausalSelfAttention)):
        attn.fused, attn.context = cfg.attention == "sdpa", parts.cp
        if (
            parts.cp is not None and attn.rope
        ):  # each token rotated by its true position in the sequence
            attn.set_positions(parts.cp.local_positions)
    if parts.cp is not None and first:
        chunk.positions = parts.cp.local_positions.to(ctx.device)
    for layer in (m for m in chunk.modules() if isinstance(m, MoE)):
        layer.state = parts.moe
    if cfg.precision != "fp32":
        chunk.to(DTYPES[cfg.precision])
    if cfg.compile:
        compile_blocks(chunk)
    return chunk


def materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate a meta-built module's tensors on `device`, uninitialised: `Module.to_empty`, but contiguous
    (to_empty's stride-preserving empty_like on meta tensors runs torch's Python reference, which imports
    sympy: ~0.4 s of every rank's start-up, measured; every tensor here is contiguous anyway). New
    Parameter objects are made (meta and device tensors are not shallow-copy compatible), so the marks
    strategies put on parameters (`tp_sharded`, `sequence_parallel_partial`) are carried over by hand."""
    marks = {name: dict(vars(p)) for name, p in module.named_parameters(remove_duplicate=False)}
    module._apply(
        lambda t: torch.empty_like(t, device=device, memory_format=torch.contiguous_format)
    )
    for name, p in module.named_parameters(
        remove_duplicate=False
    ):  # a tied head too (tied again after)
        vars(p).update(marks[name])


def wrap_data_parallel(
    cfg: RunConfig, ctx: RankContext, model: nn.Module, tp: TPContext | None
) -> GradSync:
    group = replica_group(cfg.cp)
    if (
        cfg.ep > 1 and cfg.zero
    ):  # ZeRO's slices: dense ones over dp, experts' over edp (their sum ÷ dp)
        dense, experts = expert_params(model)
        return ZeroGroups(
            [
                ZeroDataParallel(model, ctx.comm, cfg.zero, cfg.bucket_mb, only=dense),
                ZeroDataParallel(
                    model,
                    ctx.comm,
                    cfg.zero,
                    cfg.bucket_mb,
                    group="edp",
                    only=experts,
                    average_over=cfg.dp,
                ),
            ]
        )
    if (
        cfg.ep > 1
    ):  # experts over the ranks holding the same ones (their sum ÷ dp), the rest over dp
        dense, experts = expert_params(model)
        return ChainedGradSync(
            [
                BucketedDataParallel(
                    model, ctx.comm, cfg.bucket_mb, cfg.allreduce, grad_dtype(cfg), only=dense
                ),
                BucketedDataParallel(
                    model,
                    ctx.comm,
                    cfg.bucket_mb,
                    "backend",
                    grad_dtype(cfg),
                    group="edp",
                    only=experts,
                    average_over=cfg.dp,
                ),
            ]
        )
    if cfg.zero == 3:
        dp: GradSync = Zero3DataParallel(gpt_units(model), ctx.comm, cfg.prefetch, group)
    elif cfg.zero in (1, 2):
        dp = ZeroDataParallel(
            model, ctx.comm, cfg.zero, cfg.bucket_mb, ring=cfg.allreduce == "ring", group=group
        )
    elif cfg.dp_impl == "naive":
        dp = NaiveDataParallel(model, ctx.comm, grad_dtype(cfg), group)
    else:
        compression = DTYPES.get(cfg.grad_compression)  # None: no compression
        dp = BucketedDataParallel(
            model, ctx.comm, cfg.bucket_mb, cfg.allreduce, grad_dtype(cfg), compression, group
        )
    return dp if tp is None else ChainedGradSync([dp, TensorParallelGrads(model, tp)])


def grad_dtype(cfg: RunConfig) -> torch.dtype:
    """What gradients accumulate and are all-reduced in: fp32 (a 16-bit model's main_grad) or 16 bits."""
    return torch.float32 if cfg.grad_reduce_dtype == "fp32" else DTYPES[cfg.grad_reduce_dtype]


def build_updater(
    cfg: RunConfig, ctx: RankContext, model: nn.Module, grad_sync: GradSync, tp: TPContext | None
) -> Updater:
    pp_comm = ctx.comm if cfg.pp > 1 else None  # the gradient norm sums every stage's share
    hyper = AdamHyper(cfg.weight_decay, (cfg.adam_beta1, cfg.adam_beta2), cfg.adam_eps)
    if isinstance(
        grad_sync, ZeroDataParallel | Zero3DataParallel | ZeroGroups
    ):  # each rank updates its partition
        after = None if isinstance(grad_sync, Zero3DataParallel) else grad_sync.gather_params
        if (
            cfg.offload_optimizer
        ):  # ZeRO-Offload: the update on the host, each slice's gradient copied as it is final
            updater = OffloadedAdamWUpdater(
                grad_sync.shards, ctx.comm, cfg.lr, hyper, pp_comm, after, grad_sync.group
            )
            grad_sync.on_reduced = updater.offload_grad
            return updater
        return ShardedAdamWUpdater(
            grad_sync.shards, ctx.comm, cfg.lr, hyper, pp_comm, after, grad_sync.group
        )
    params = list(model.parameters())
    if cfg.precision != "fp32":  # fp32 master weights and moments, 16-bit model
        return MixedPrecisionUpdater(
            params,
            ctx.comm,
            cfg.precision,
            cfg.lr,
            hyper,
            cfg.loss_scale_init,
            cfg.loss_scale_growth_interval,
            tp,
            pp_comm,
            ctx.memory,
        )
    if cfg.optimizer == "onebit-adam":  # AdamW during the warm-up, then compressed momentum
        return OneBitAdamUpdater(
            params, ctx.comm, cfg.lr, hyper, cfg.onebit_warmup_steps, grad_sync
        )
    return AdamWUpdater(params, cfg.lr, hyper, tp, pp_comm, ctx.comm if cfg.ep > 1 else None)


def pipeline_executor(
    cfg: RunConfig,
    ctx: RankContext,
    schedule: Schedule,
    chunks: dict[int, nn.Module],
    grad_sync: GradSync,
) -> PipelineExecutor:
    mcfg = cfg.model_config
    micro = cfg.local_batch // cfg.microbatches
    seq = (
        mcfg.seq_len // cfg.cp // (cfg.tp if cfg.sequence_parallel else 1)
    )  # what travels between stages
    return PipelineExecutor(
        schedule,
        ctx.groups.index("pp"),
        chunks,
        ctx.comm,
        ctx.memory,
        (micro, seq, mcfg.hidden),
        ctx.device,
        grad_sync,
        DTYPES.get(cfg.precision, torch.float32),
    )


def moe_state(cfg: RunConfig, comm: Communicator) -> MoEState | None:
    """The MoE layers' shared state for a run (None without experts): the counts summed over dp, the
    expert-parallel dispatcher when ep > 1 (parallel/expert_parallel.py)."""
    if not cfg.model_config.experts:
        return None

    def all_reduce(t: torch.Tensor, layer: str) -> torch.Tensor:
        comm.all_reduce(t, "dp", label=f"moe {layer} counts")
        return t

    return MoEState(
        aux_coef=cfg.aux_loss_coef,
        bias_rate=cfg.router_bias_rate,
        capacity_factor=cfg.capacity_factor if cfg.moe_dispatch == "capacity" else 0.0,
        all_reduce=all_reduce if cfg.dp > 1 else None,
        dispatcher=ExpertParallel(comm, cfg.model_config.experts) if cfg.ep > 1 else None,
    )
