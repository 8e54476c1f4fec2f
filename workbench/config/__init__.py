"""config: what a run is, as data — the first step of the flow, and the lowest layer (no torch).

    run_config.py       RunConfig: every setting of a launch; validate() → ValidConfig, checked once, written
                        to the run directory
    model_config.py     ModelConfig: a GPT's dimensions, its presets, ConfigError
    rules.py            the rules that span several fields, by subject (communication, optimizer, ZeRO, data
                        and tools, context and expert parallelism, compile, limits, which steps are measured)
    pipeline_rules.py   the pipeline's: schedule names, a CSV schedule's file, the stages' split
    backend.py          which torch.distributed backend a launch runs on (launcher and ranks alike)
    grid.py             RankGrid: global rank ↔ (pp, dp, cp, tp) coordinates, plain arithmetic
    data_spec.py        a data spec checked before launch (the file, its tokens, nanoGPT's meta.pkl)
    links.py            an emulated network's links as given

Every bad value is a ConfigError naming it and what would be valid, before any process starts.
"""

from workbench.config.model_config import PRESETS, ConfigError, ModelConfig
from workbench.config.run_config import (
    ALLREDUCE,
    BACKENDS,
    DP_IMPLS,
    FAULTS,
    PRECISIONS,
    RECOMPUTE,
    RESOLVED,
    SCHEDULES,
    RunConfig,
    ValidConfig,
    validated,
)

__all__ = [
    "ALLREDUCE",
    "BACKENDS",
    "DP_IMPLS",
    "FAULTS",
    "PRECISIONS",
    "PRESETS",
    "RECOMPUTE",
    "RESOLVED",
    "SCHEDULES",
    "ConfigError",
    "ModelConfig",
    "RunConfig",
    "ValidConfig",
    "validated",
]
