"""Build, once, everything one rank needs to train: its `Strategy` (torchtitan's parallelize step).

    dense GPT, on the meta device (nothing allocated), built with its wiring   model/gpt.py, ModelWiring
      (the attention kernel; context parallelism's ring attention and this rank's positions,
      parallel/context_parallel.ContextParallel; the MoE state and expert dispatcher, model/moe.py,
      parallel/expert_parallel.py; activation recomputation, engine/recompute.Recompute)
      → tensor-parallel module swap                              parallel/tensor_parallel.apply_tensor_parallel
      → expert parallelism: this ep rank's experts               parallel/expert_parallel.shard_experts
      → materialise on the device, initialise by parameter name  GPT.init_weights
      → precision (16-bit parameters and activations)
      → torch.compile of each transformer block (--compile)        engine/compiled.py
    (one such chunk per pipeline stage of this rank, `pipeline/stages.py`)
      → the parameters' facts (what decays, what is a tp/expert shard, what is partial)  a ParamTable
      → gradient sync: ZeRO-3 | ZeRO-1/2 | bucketed | naive DP (+ TP partial gradients)   a GradSync
        (over dp, or dp×cp — the `dp_cp` group — under context parallelism; experts over edp when ep > 1)
        (a 16-bit model's gradients in fp32 main-gradient buckets unless grad_reduce_dtype says 16 bits)
      → updater: sharded AdamW (ZeRO; on the host with offload) | mixed precision | AdamW  an Updater
      → forward/backward: the pipeline executor running the schedule, or one batch

Every piece is handed its collaborators by keyword when it is built — the communicator, the recorder, the
memory tracker, the facts, where the main gradients are, ZeRO-Offload's host gradients (the ZeRO grad
sync's `on_reduced`) —; no link is set after construction. One module patch remains, made while the
pipeline executor is built: a zero-bubble schedule routes its chunks' Linears through the weight-gradient
store (pipeline/weight_grad.split_linears), so that backward can defer their weight gradients.

The training step (`engine/train_step.py`) then only calls the pieces: forward_backward.run →
grad_sync.wait → updater.step → grad_sync.zero_grad.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workbench.comm.groups import ProcessGroups
from workbench.comm.traced import Communicator
from workbench.config import RunConfig
from workbench.engine.anomaly import LossSpike
from workbench.engine.build_sync import data_parallel
from workbench.engine.build_updater import build_updater
from workbench.engine.compiled import compile_blocks
from workbench.engine.context import RankContext
from workbench.engine.forward_backward import ForwardBackward, SingleBatch
from workbench.engine.recompute import Recompute
from workbench.measure.memory import MemoryTracker
from workbench.model.gpt import GPT, ModelWiring
from workbench.model.moe import MoEState
from workbench.optim.mixed_precision import DTYPES
from workbench.optim.offload import HostGradients
from workbench.optim.updater import Updater
from workbench.optim.weight_decay import decays
from workbench.parallel.context_parallel import ContextParallel
from workbench.parallel.expert_parallel import (
    ExpertParallel,
    is_expert_shard,
    shard_experts,
)
from workbench.parallel.grad_sync import ChainedGradSync, GradSync
from workbench.parallel.main_grad import MainGrads
from workbench.parallel.param_facts import ParamFacts, ParamTable
from workbench.parallel.tensor_parallel import (
    TensorParallelGrads,
    apply_tensor_parallel,
    tensor_parallel_role,
)
from workbench.parallel.tp_communications import TPContext
from workbench.parallel.twin_grads import TwinGradients
from workbench.parallel.zero3 import Zero3DataParallel
from workbench.pipeline.executor import PipelineExecutor
from workbench.pipeline.stages import build_stages
from workbench.schedules.build import Schedule, build_schedule
from workbench.trace.recorder import TraceRecorder


@dataclass(kw_only=True)
class Strategy:
    """One rank's assembled training: what `train_step` runs, built once by `parallelize`. It holds the
    model and its parts (grad sync, updater, forward/backward, the parameters' facts), and the
    collaborators that the step, the evaluation and the checkpoint use with them, handed over from the
    rank's `RankContext`: the recorder, the communicator, the memory tracker, the process groups and
    the device. The config is not among them: the training loop passes it to the calls that read it."""

    recorder: TraceRecorder
    comm: Communicator
    memory: MemoryTracker
    groups: ProcessGroups
    device: torch.device
    model: nn.Module  # the whole model, or a ModuleDict of this rank's pipeline chunks
    grad_sync: GradSync
    updater: Updater
    forward_backward: ForwardBackward
    state_params: list[torch.Tensor]  # what the `parameter` memory category holds
    facts: ParamTable  # each of the model's parameters' facts (the checkpoint's layout reads them)
    schedule: Schedule | None = None  # when the step runs a microbatch schedule
    loss_spike: LossSpike | None = None  # skips a step whose loss jumps (engine/anomaly.py)
    #: cp > 1: shards each batch's sequence, counts attention work
    context: ContextParallel | None = None
    moe: MoEState | None = None  # a model with experts: the MoE layers' shared state (model/moe.py)

    def count_model_states(self, *, measured: bool, data_bytes: int = 0) -> None:
        """Re-count parameters, gradients and optimizer state — in a `measured` step (or at start-up, which
        is measured) only; `data_bytes`: what the data source keeps for the run, counted under `other`."""
        if not measured:
            return
        self.memory.count_model_states(
            self.state_params,
            self.grad_sync.grad_tensors(),
            self.updater.state_tensors(),
            self.updater.counter_tensors(),
            data_bytes=data_bytes,
        )
        if host := self.updater.host_tensors():  # ZeRO-Offload: what the host holds
            self.memory.count_host(host)


def runs_schedule(cfg: RunConfig) -> bool:
    """Pipeline stages, or gradient accumulation (a one-stage schedule of microbatches)."""
    return cfg.pp > 1 or cfg.microbatches > 1


@dataclass(frozen=True, kw_only=True)
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
                comm=ctx.comm,
                rank=ctx.groups.index("tp"),
                size=ctx.groups.size("tp"),
                sequence_parallel=cfg.sequence_parallel,
            )
        recompute = None
        if cfg.recompute != "none":
            recompute = Recompute(mode=cfg.recompute, recorder=ctx.recorder, memory=ctx.memory)
        cp = None
        if cfg.cp > 1:
            cp = ContextParallel(
                ctx.comm,
                recorder=ctx.recorder,
                seq_len=cfg.model_config.seq_len,
                balance=cfg.cp_balance,
                rotate=cfg.cp_rotate,
            )
        return cls(tp=tp, recompute=recompute, cp=cp, moe=moe_state(cfg, ctx.comm))


def parallelize(cfg: RunConfig, ctx: RankContext) -> Strategy:
    """This rank's Strategy, built once: the model's chunks, their parameters' facts, then data
    parallelism, the updater and how a step's forwards and backwards run (the module's docstring draws
    the order)."""
    torch.manual_seed(cfg.seed)
    parts = ChunkParts.of(cfg, ctx)
    schedule, chunks = None, None
    if runs_schedule(cfg):
        schedule = build_schedule(
            cfg.schedule if cfg.pp > 1 else "1f1b", cfg.pp, cfg.microbatches, cfg.virtual_stages
        )

        def stage(layers: range, first: bool, last: bool) -> nn.Module:
            return build_chunk(cfg, ctx, parts, layers=layers, first=first, last=last)

        chunks = build_stages(cfg.model_config.layers, schedule, ctx.groups.index("pp"), stage)
        model: nn.Module = nn.ModuleDict({str(k): c for k, c in chunks.items()})
    else:
        model = build_chunk(cfg, ctx, parts)
    # DualPipe: the second copy of each part (the pipeline going up)
    copies: set[nn.Parameter] = set()
    if schedule is not None and chunks is not None and schedule.placement == "dual":
        copies = {p for k, c in chunks.items() if k >= schedule.p for p in c.parameters()}
    facts = param_facts(cfg, model, copies=copies)
    # filled by the data-parallel grad sync; read by TP's sums and the updater
    main_grads = MainGrads()
    host_grads = None
    # ZeRO-Offload: each final gradient slice goes to the host as it comes
    if cfg.offload_optimizer:
        host_grads = HostGradients(device=ctx.device, recorder=ctx.recorder, comm=ctx.comm)
    dp_sync = data_parallel(
        cfg,
        ctx,
        model,
        facts=facts,
        main_grads=main_grads,
        on_reduced=None if host_grads is None else host_grads.copy,
    )
    grad_sync = dp_sync
    if parts.tp is not None and cfg.ep == 1:  # ZeRO is refused with tp (config/rules.py)
        tp_grads = TensorParallelGrads(model, parts.tp, facts=facts, main_grads=main_grads)
        grad_sync = ChainedGradSync([dp_sync, tp_grads])
    if schedule is not None and chunks is not None and schedule.placement == "dual":
        grad_sync = ChainedGradSync([grad_sync, twin_gradients(ctx, schedule, chunks, main_grads)])
    updater = build_updater(
        cfg,
        ctx,
        model,
        dp_sync,
        tp=parts.tp,
        facts=facts,
        main_grads=main_grads,
        host_grads=host_grads,
    )
    if schedule is not None and chunks is not None:
        forward_backward: ForwardBackward = pipeline_executor(cfg, ctx, schedule, chunks, grad_sync)
    else:
        forward_backward = SingleBatch(model, ctx.recorder, ctx.memory, ctx.device)
    state_params: list[torch.Tensor] = list(model.parameters())
    if isinstance(dp_sync, Zero3DataParallel):  # the slices are all that is kept
        state_params = list(dp_sync.shards)
    ctx.memory.register_model(model)
    return Strategy(
        recorder=ctx.recorder,
        comm=ctx.comm,
        memory=ctx.memory,
        groups=ctx.groups,
        device=ctx.device,
        model=model,
        grad_sync=grad_sync,
        updater=updater,
        forward_backward=forward_backward,
        state_params=state_params,
        facts=facts,
        schedule=schedule,
        loss_spike=LossSpike(cfg.loss_spike_factor) if cfg.loss_spike_factor > 0 else None,
        context=parts.cp,
        moe=parts.moe,
    )


def build_chunk(
    cfg: RunConfig,
    ctx: RankContext,
    parts: ChunkParts,
    *,
    layers: range | None = None,
    first: bool = True,
    last: bool = True,
) -> GPT:
    """The model (or one pipeline stage of it): dense on meta, built with what the rank hands its modules
    (attention's kernel, context parallelism, the experts' state, recomputation, the loss's memory
    tracker) → TP swap → experts sharded → device, init by name → precision → compile."""
    positions = None
    # this rank's tokens' global positions (its rotary tables, its wpe rows)
    if parts.cp is not None:
        positions = parts.cp.local_positions.to(ctx.device)
    wiring = ModelWiring(
        fused_attention=cfg.attention == "sdpa",
        context=parts.cp,
        positions=positions,
        moe=parts.moe,
        recompute=parts.recompute,
        memory=ctx.memory if last else None,
    )
    with torch.device("meta"):
        chunk = GPT(cfg.model_config, layers=layers, first=first, last=last, wiring=wiring)
    if parts.tp is not None:
        apply_tensor_parallel(chunk, parts.tp)
    if cfg.ep > 1:
        shard_experts(chunk, ctx.groups.index("ep"), cfg.ep)
    materialize(chunk, ctx.device)
    chunk.tie()  # materialising made new parameters: the head takes the token table again
    chunk.init_weights(cfg.seed)
    if cfg.precision != "fp32":
        chunk.to(DTYPES[cfg.precision])
    if cfg.compile:
        compile_blocks(chunk)
    return chunk


def materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate a meta-built module's tensors on `device`, uninitialised: `Module.to_empty`, but contiguous
    (to_empty's stride-preserving empty_like on meta tensors runs torch's Python reference, which imports
    sympy: ~0.4 s of every rank's start-up, measured; every tensor here is contiguous anyway). New
    Parameter objects are made (meta and device tensors are not shallow-copy compatible): the parameters'
    facts are taken after this (`param_facts`)."""
    module._apply(
        lambda t: torch.empty_like(t, device=device, memory_format=torch.contiguous_format)
    )


def twin_gradients(
    ctx: RankContext, schedule: Schedule, chunks: dict[int, nn.Module], main_grads: MainGrads
) -> TwinGradients:
    """DualPipe: the sum of each part's two copies' gradients, with the pp rank that holds the same parts
    (pp − 1 − r), each rank's chunks listed by part (parallel/twin_grads.py)."""
    pp = ctx.groups.index("pp")
    twin = ctx.groups.ranks["pp"][schedule.p - 1 - pp]
    by_part = [chunks[k] for k in sorted(chunks, key=lambda k: schedule.model_part(k)[0])]
    return TwinGradients(by_part, ctx.comm, twin=twin, main_grads=main_grads, memory=ctx.memory)


def param_facts(
    cfg: RunConfig, model: nn.Module, *, copies: set[nn.Parameter] | None = None
) -> ParamTable:
    """Each parameter's facts, said once (parallel/param_facts.py): whether it decays (by its name and
    shape, optim/weight_decay.py), whether it is a tensor-parallel shard or has a sequence-parallel partial
    gradient (by its module's type, after the swap), whether it is an expert-parallel shard, whether it
    is DualPipe's second copy (`copies`). A tied head is
    the token table: it is answered by that name (its first)."""
    sequence_parallel = cfg.tp > 1 and cfg.sequence_parallel
    facts: dict[torch.Tensor, ParamFacts] = {}
    for module_name, module in model.named_modules():
        for leaf, p in module.named_parameters(recurse=False):
            if p in facts:
                continue
            name = f"{module_name}.{leaf}" if module_name else leaf
            tp_sharded, partial = tensor_parallel_role(module, leaf, sequence_parallel)
            facts[p] = ParamFacts(
                decay_ranges=None if decays(name, p, cfg.decay_embeddings) else (),
                tp_sharded=tp_sharded,
                sequence_parallel_partial=partial,
                expert_sharded=is_expert_shard(module),
                pipeline_copy=copies is not None and p in copies,
            )
    return ParamTable(facts)


def pipeline_executor(
    cfg: RunConfig,
    ctx: RankContext,
    schedule: Schedule,
    chunks: dict[int, nn.Module],
    grad_sync: GradSync,
) -> PipelineExecutor:
    mcfg = cfg.model_config
    micro = cfg.local_batch // cfg.microbatches
    # what travels between stages
    seq = mcfg.seq_len // cfg.cp // (cfg.tp if cfg.sequence_parallel else 1)
    return PipelineExecutor(
        schedule,
        ctx.groups.index("pp"),
        chunks,
        ctx.comm,
        recorder=ctx.recorder,
        memory=ctx.memory,
        hidden_shape=(micro, seq, mcfg.hidden),
        device=ctx.device,
        grad_sync=grad_sync,
        dtype=DTYPES.get(cfg.precision, torch.float32),
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
