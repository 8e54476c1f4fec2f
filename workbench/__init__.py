"""workbench: learn and profile distributed training by running it for real.

    import workbench as wb
    run = wb.launch(wb.RunConfig(dp=2, steps=20, model="tiny"), out="traces/dp2")
    run.metrics, run.events, run.memory, run.summary

Importing the package does not import torch: configs, the launcher, run loading and the charts work
without it (the ranks that torchrun starts import it).
"""

from workbench.config import ConfigError, ModelConfig, RunConfig
from workbench.estimator import Estimate, Hardware, estimate
from workbench.launcher import Nodes, RunFailed, launch
from workbench.planner import Cluster, plan
from workbench.run import Run, load


def compare(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - imports plotly only when used
    """Launch configurations and compare them: see workbench.comparison.compare."""
    from workbench.comparison import compare as _compare

    return _compare(*args, **kwargs)


def calibrate(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """Measure this machine's rates: see workbench.calibration.calibrate."""
    from workbench.calibration import calibrate as _calibrate

    return _calibrate(*args, **kwargs)


__all__ = ["Cluster", "ConfigError", "Estimate", "Hardware", "ModelConfig", "Nodes", "Run", "RunConfig", "RunFailed",
           "calibrate", "compare", "estimate", "launch", "load", "plan"]
__version__ = "0.1.0"
