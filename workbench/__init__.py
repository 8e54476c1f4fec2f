"""workbench: learn and profile distributed training by running it for real.

    import workbench as wb
    run = wb.launch(wb.RunConfig(dp=2, steps=20, model="tiny"), out="traces/dp2")
    run.metrics, run.events, run.memory, run.summary

Importing the package does not import torch: configs, the launcher, run loading and the charts work
without it (the ranks that torchrun starts import it). Only the configuration is imported eagerly; the
rest (the launcher, runs, the estimator — pandas and plotly behind them) on first use, so that every
rank torchrun starts does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import Any

from workbench.config import ConfigError, ModelConfig, RunConfig

#: public name → the module that defines it (imported on first use)
_LAZY = {
    "Estimate": "workbench.predict.estimator",
    "Hardware": "workbench.predict.estimator",
    "RunLayout": "workbench.predict.run_layout",
    "estimate": "workbench.predict.estimator",
    "Cluster": "workbench.predict.planner",
    "plan": "workbench.predict.planner",
    "Nodes": "workbench.launching.launcher",
    "LocalCluster": "workbench.launching.local_cluster",
    "cluster": "workbench.launching.local_cluster",
    "RunFailed": "workbench.launching.launcher",
    "launch": "workbench.launching.launcher",
    "Run": "workbench.analysis.run",
    "load": "workbench.analysis.run",
    "compare": "workbench.studies.comparison",
    "calibrate": "workbench.studies.calibration",
    "sample": "workbench.engine.sample",
    "what_if": "workbench.analysis.what_if",
}


#: subpackages reached as attributes (`wb.exercises`), imported on first use (not in __all__: a star import
#: would import them)
_LAZY_PACKAGES = ("exercises",)


def __getattr__(name: str) -> Any:
    if name in _LAZY_PACKAGES:
        return importlib.import_module(f"workbench.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "Cluster",
    "ConfigError",
    "Estimate",
    "Hardware",
    "LocalCluster",
    "ModelConfig",
    "Nodes",
    "Run",
    "RunConfig",
    "RunFailed",
    "RunLayout",
    "calibrate",
    "cluster",
    "compare",
    "estimate",
    "launch",
    "load",
    "plan",
    "sample",
    "what_if",
]
__version__ = "0.1.0"
