"""How a step's forward and backward run on one rank: the `ForwardBackward` contract.

    run(x, y, step, loss_scale) -> loss     forwards and backwards of the rank's local batch; backward
                                            of loss × loss_scale; gradients left for the GradSync
    evaluate(x, y, step) -> loss            the forwards alone (the validation loss: engine/evaluate.py)

Implemented by `SingleBatch` (below: the whole local batch at once) and by
`pipeline.executor.PipelineExecutor` (a schedule of microbatches over pipeline stages — also gradient
accumulation, which is a one-stage schedule).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from workbench.measure.memory import MemoryTracker
from workbench.trace.recorder import TraceRecorder


class ForwardBackward(Protocol):
    def run(
        self, x: torch.Tensor, y: torch.Tensor, step: int, loss_scale: float = 1.0
    ) -> torch.Tensor: ...

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        """The loss of the local batch, forward only (the caller holds torch.no_grad)."""


class SingleBatch:
    """One forward (its saved tensors counted as activations) and one backward of the whole local batch."""

    def __init__(
        self, model: nn.Module, recorder: TraceRecorder, memory: MemoryTracker, device: torch.device
    ) -> None:
        self.model, self.recorder, self.memory, self.device = model, recorder, memory, device

    def run(
        self, x: torch.Tensor, y: torch.Tensor, step: int, loss_scale: float = 1.0
    ) -> torch.Tensor:
        with self.recorder.span("forward", "forward", "compute", step=step, microbatch=0):
            with self.memory.count_saved_activations():
                loss = self.model(x, y)
            self.recorder.sync_compute()
        self.memory.snapshot()
        with self.recorder.span("backward", "backward", "compute", step=step, microbatch=0):
            (loss * loss_scale if loss_scale != 1.0 else loss).backward()
            self.recorder.sync_compute()
        return loss

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        with self.recorder.span(
            "forward", "forward", "compute", step=step, microbatch=0, evaluation=True
        ):
            loss = self.model(x, y)
            self.recorder.sync_compute()
        return loss
