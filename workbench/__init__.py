"""workbench: learn and profile distributed training by running it for real.

    import workbench as wb
    run = wb.launch(wb.RunConfig(dp=2, steps=20, model="tiny"), out="traces/dp2")
    run.metrics, run.events, run.memory, run.summary

Importing the package does not import torch: configs, the launcher, run loading and the charts work
without it (the ranks that torchrun starts import it).
"""

from workbench.config import ConfigError, ModelConfig, RunConfig
from workbench.launcher import Nodes, RunFailed, launch
from workbench.run import Run, load

__all__ = ["ConfigError", "ModelConfig", "Nodes", "Run", "RunConfig", "RunFailed", "launch", "load"]
__version__ = "0.1.0"
