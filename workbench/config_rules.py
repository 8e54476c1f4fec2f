"""Rules of RunConfig that span several of its fields: communication (hierarchical all-reduce, emulated
links), the optimizer (1-bit Adam's conditions) and elastic membership. `RunConfig.validate` calls them;
each raises ConfigError naming the bad value and what would be valid."""

from __future__ import annotations

from typing import Any

from workbench.model_config import ConfigError

OPTIMIZERS = ("adamw", "onebit-adam")


def check_communication(cfg: Any) -> None:
    world = cfg.world_size
    if cfg.ranks_per_node < 0 or (cfg.ranks_per_node and world % cfg.ranks_per_node):
        valid = [d for d in range(1, world + 1) if world % d == 0]
        raise ConfigError(f"ranks_per_node={cfg.ranks_per_node}: the emulated machines must split the {world} "
                          f"ranks evenly; valid: {valid} (0: the real machine's)")
    if cfg.allreduce == "hierarchical" and cfg.ranks_per_node:
        from workbench.grid import RankGrid, node_groups

        try:
            node_groups(RankGrid(dp=cfg.dp, tp=cfg.tp, pp=cfg.pp), cfg.ranks_per_node)
        except ValueError as e:
            raise ConfigError(f"allreduce='hierarchical' with ranks_per_node={cfg.ranks_per_node}: {e}") from None
    if cfg.emulate_link is not None:
        from workbench.comm.emulated_link import parse_links

        try:
            parse_links(cfg.emulate_link)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def check_optimizer(cfg: Any) -> None:
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer={cfg.optimizer!r}: valid optimizers are {list(OPTIMIZERS)}")
    if cfg.optimizer != "onebit-adam":
        return
    if not 1 <= cfg.onebit_warmup_steps < cfg.steps:
        raise ConfigError(f"onebit_warmup_steps={cfg.onebit_warmup_steps}: 1-bit Adam needs a warm-up of at least one "
                          f"step, shorter than the run (steps={cfg.steps}), to freeze Adam's variance")
    plain = {"tp": 1, "pp": 1, "zero": 0, "precision": "fp32", "dp_impl": "bucketed", "allreduce": "backend",
             "grad_compression": "none", "checkpoint_every": 0, "resume": None}
    bad = {k: getattr(cfg, k) for k, v in plain.items() if getattr(cfg, k) != v}
    if bad:
        raise ConfigError(f"optimizer='onebit-adam' is built for fp32 data parallelism without checkpoints; "
                          f"these settings would need {plain}: {bad}")


def check_elastic(cfg: Any) -> None:
    if cfg.elastic and (cfg.checkpoint_every < 1 or cfg.max_restarts < 1):
        raise ConfigError(f"elastic=True needs checkpoint_every ≥ 1 (got {cfg.checkpoint_every}) and max_restarts ≥ 1 "
                          f"(got {cfg.max_restarts}): a group re-formed after a machine left resumes from the newest "
                          f"checkpoint, and the leaving counts as one of torchrun's restarts")
