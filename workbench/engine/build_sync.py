"""Which gradient sync a rank's config gets, built with its collaborators (engine/parallelize.py calls it):

    ep > 1      experts over edp, the rest over dp: ZeRO's slices over both (`ZeroGroups`) or two bucketed syncs
    zero = 3    ZeRO-3 over the model's units (`GPT.units`)
    zero 1, 2   ZeRO-1/2 (`on_reduced`: ZeRO-Offload's host copies)
    naive       one all-reduce per parameter after backward
    otherwise   bucketed DP (compression, our rings, hierarchical)

over dp, or dp×cp (the `dp_cp` group) under context parallelism. Each is handed the communicator, the
parameters' facts, where a 16-bit model's main gradients go and the memory tracker.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.config import RunConfig
from workbench.config.grid import replica_group
from workbench.engine.context import RankContext
from workbench.model.gpt import GPT
from workbench.optim.mixed_precision import DTYPES
from workbench.parallel.data_parallel import BucketedDataParallel, NaiveDataParallel
from workbench.parallel.expert_parallel import expert_params
from workbench.parallel.grad_sync import ChainedGradSync, GradSync
from workbench.parallel.main_grad import MainGrads
from workbench.parallel.param_facts import ParamTable
from workbench.parallel.zero import OnReduced, ZeroDataParallel, ZeroGroups
from workbench.parallel.zero3 import Zero3DataParallel


def data_parallel(
    cfg: RunConfig,
    ctx: RankContext,
    model: nn.Module,
    *,
    facts: ParamTable,
    main_grads: MainGrads,
    on_reduced: OnReduced | None,
) -> GradSync:
    """The gradient sync over the ranks holding the same parameters: ZeRO-3, ZeRO-1/2, bucketed or naive
    DP (experts over edp and the rest over dp under expert parallelism)."""
    group = replica_group(cfg.cp)
    if cfg.ep > 1:
        return expert_data_parallel(cfg, ctx, model, facts=facts, main_grads=main_grads)
    if cfg.zero == 3:
        return Zero3DataParallel(
            model_units(model),
            ctx.comm,
            prefetch=cfg.prefetch,
            group=group,
            facts=facts,
            memory=ctx.memory,
            on_reduced=on_reduced,
        )
    if cfg.zero in (1, 2):
        return ZeroDataParallel(
            model,
            ctx.comm,
            stage=cfg.zero,
            bucket_mb=cfg.bucket_mb,
            ring=cfg.allreduce == "ring",
            group=group,
            facts=facts,
            memory=ctx.memory,
            on_reduced=on_reduced,
        )
    if cfg.dp_impl == "naive":
        return NaiveDataParallel(
            model, ctx.comm, grad_dtype=grad_dtype(cfg), group=group, main_grads=main_grads
        )
    return BucketedDataParallel(
        model,
        ctx.comm,
        bucket_mb=cfg.bucket_mb,
        algorithm=cfg.allreduce,
        grad_dtype=grad_dtype(cfg),
        compression=DTYPES.get(cfg.grad_compression),  # None: no compression
        group=group,
        main_grads=main_grads,
        memory=ctx.memory,
    )


def expert_data_parallel(
    cfg: RunConfig, ctx: RankContext, model: nn.Module, *, facts: ParamTable, main_grads: MainGrads
) -> GradSync:
    """Expert parallelism: the experts' gradients over the ranks holding the same ones (edp; their sum ÷
    dp), the rest over dp — ZeRO's slices (`ZeroGroups`) or buckets."""
    dense, experts = expert_params(model, facts)
    if cfg.zero:
        return ZeroGroups(
            [
                ZeroDataParallel(
                    model,
                    ctx.comm,
                    stage=cfg.zero,
                    bucket_mb=cfg.bucket_mb,
                    only=dense,
                    facts=facts,
                    memory=ctx.memory,
                ),
                ZeroDataParallel(
                    model,
                    ctx.comm,
                    stage=cfg.zero,
                    bucket_mb=cfg.bucket_mb,
                    group="edp",
                    only=experts,
                    average_over=cfg.dp,
                    facts=facts,
                    memory=ctx.memory,
                ),
            ]
        )
    return ChainedGradSync(
        [
            BucketedDataParallel(
                model,
                ctx.comm,
                bucket_mb=cfg.bucket_mb,
                algorithm=cfg.allreduce,
                grad_dtype=grad_dtype(cfg),
                only=dense,
                main_grads=main_grads,
                memory=ctx.memory,
            ),
            BucketedDataParallel(
                model,
                ctx.comm,
                bucket_mb=cfg.bucket_mb,
                algorithm="backend",
                grad_dtype=grad_dtype(cfg),
                group="edp",
                only=experts,
                average_over=cfg.dp,
                main_grads=main_grads,
                memory=ctx.memory,
            ),
        ]
    )


def model_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """ZeRO-3's units: the model's own pieces (`GPT.units`; ZeRO-3 runs on a whole model, config/rules.py)."""
    if not isinstance(model, GPT):
        raise TypeError(f"ZeRO-3 gathers a GPT's units; got {type(model).__name__}")
    return model.units()


def grad_dtype(cfg: RunConfig) -> torch.dtype:
    """What gradients accumulate and are all-reduced in: fp32 (a 16-bit model's main gradients) or 16 bits."""
    return torch.float32 if cfg.grad_reduce_dtype == "fp32" else DTYPES[cfg.grad_reduce_dtype]
