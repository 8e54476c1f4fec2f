"""Which updater a rank's config gets, built with its collaborators (engine/parallelize.py calls it): ZeRO's
slices (on the host with ZeRO-Offload), a 16-bit model's fp32 masters, 1-bit Adam, or AdamW on the whole
(or tensor-parallel) parameters — each handed the parameters' facts, the communicators of the norm's sums,
and what it reads of the grad sync (ZeRO's slices, a 16-bit model's main gradients).
"""

from __future__ import annotations

from torch import nn

from workbench.comm.traced import Communicator
from workbench.config import RunConfig
from workbench.engine.context import RankContext
from workbench.optim.mixed_precision import MixedPrecisionUpdater
from workbench.optim.offload import HostGradients, OffloadedAdamWUpdater
from workbench.optim.onebit_adam import OneBitAdamUpdater
from workbench.optim.updater import AdamHyper, AdamWUpdater, ShardedAdamWUpdater, Updater
from workbench.parallel.data_parallel import BucketedDataParallel
from workbench.parallel.grad_sync import GradSync, ShardedGradSync
from workbench.parallel.main_grad import MainGrads
from workbench.parallel.param_facts import ParamTable
from workbench.parallel.tp_communications import TPContext
from workbench.parallel.zero import ZeroDataParallel, ZeroGroups
from workbench.parallel.zero3 import Zero3DataParallel


def build_updater(
    cfg: RunConfig,
    ctx: RankContext,
    model: nn.Module,
    dp_sync: GradSync,
    *,
    tp: TPContext | None,
    facts: ParamTable,
    main_grads: MainGrads,
    host_grads: HostGradients | None,
) -> Updater:
    """The optimizer step for the data-parallel sync `dp_sync`: ZeRO's slices (on the host with offload),
    a 16-bit model's fp32 masters, 1-bit Adam, or AdamW on the whole (or tensor-parallel) parameters."""
    pp_comm = ctx.comm if cfg.pp > 1 else None  # the gradient norm sums every stage's share
    hyper = AdamHyper(
        weight_decay=cfg.weight_decay, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps
    )
    if isinstance(dp_sync, ZeroDataParallel | Zero3DataParallel | ZeroGroups):
        return sharded_updater(
            cfg, ctx, dp_sync, hyper=hyper, pp_comm=pp_comm, host_grads=host_grads
        )
    params = list(model.parameters())
    if cfg.precision != "fp32":  # fp32 master weights and moments, 16-bit model
        return MixedPrecisionUpdater(
            params,
            ctx.comm,
            precision=cfg.precision,
            lr=cfg.lr,
            hyper=hyper,
            init_scale=cfg.loss_scale_init,
            growth_interval=cfg.loss_scale_growth_interval,
            facts=facts,
            main_grads=main_grads,
            tp=tp,
            pp_comm=pp_comm,
            memory=ctx.memory,
        )
    if cfg.optimizer == "onebit-adam":  # AdamW during the warm-up, then compressed momentum
        assert isinstance(dp_sync, BucketedDataParallel), "1-bit Adam runs on bucketed DP (rules)"
        return OneBitAdamUpdater(
            params,
            ctx.comm,
            lr=cfg.lr,
            hyper=hyper,
            warmup_steps=cfg.onebit_warmup_steps,
            grad_sync=dp_sync,
            facts=facts,
        )
    return AdamWUpdater(
        params,
        lr=cfg.lr,
        hyper=hyper,
        facts=facts,
        tp=tp,
        pp_comm=pp_comm,
        ep_comm=ctx.comm if cfg.ep > 1 else None,
    )


def sharded_updater(
    cfg: RunConfig,
    ctx: RankContext,
    sync: ShardedGradSync,
    *,
    hyper: AdamHyper,
    pp_comm: Communicator | None,
    host_grads: HostGradients | None,
) -> Updater:
    """ZeRO: each rank updates its slices, then the sync gathers the parameters (ZeRO-1/2); ZeRO-Offload
    on the host's copies of the slices, which the sync copied there as each became final."""
    if host_grads is not None:
        return OffloadedAdamWUpdater(
            sync.shards,
            ctx.comm,
            lr=cfg.lr,
            hyper=hyper,
            host_grads=host_grads,
            recorder=ctx.recorder,
            facts=sync.shard_facts,
            pp_comm=pp_comm,
            after_step=sync.gather_params,
            group=sync.group,
        )
    return ShardedAdamWUpdater(
        sync.shards,
        ctx.comm,
        lr=cfg.lr,
        hyper=hyper,
        facts=sync.shard_facts,
        pp_comm=pp_comm,
        after_step=sync.gather_params,
        group=sync.group,
    )
