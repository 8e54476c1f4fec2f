"""The contract between backward and the optimizer step: a `GradSync` makes every rank's gradients
the ones the update needs.

    backward ──(hooks launch collectives as gradients become ready)──▶ wait() ──▶ Updater.step()

Implemented by
    NaiveDataParallel, BucketedDataParallel     parallel/data_parallel.py   all-reduce over dp
    ZeroDataParallel (stages 1 and 2)           parallel/zero.py            reduce-scatter over dp
    Zero3DataParallel                           parallel/zero3.py           reduce-scatter over dp
    TensorParallelGrads                         parallel/tensor_parallel.py all-reduce over tp of the
                                                                            sequence-parallel partial grads
and composed by `ChainedGradSync` (data parallel first, then tensor parallel).

`no_sync()` is PyTorch DDP's: inside it, backward only accumulates (the earlier microbatches of a
gradient-accumulation step or a pipeline schedule); the backward after it launches the collectives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Protocol

import torch


class GradSync(Protocol):
    def no_sync(self) -> AbstractContextManager[None]:
        """Inside: backward accumulates gradients and launches no collective."""

    def wait(self) -> None:
        """Block until every gradient collective of this step has finished."""

    def zero_grad(self) -> None:
        """Clear the gradients for the next step (buffers are kept and zeroed where they are reused)."""

    def grad_tensors(self) -> list[torch.Tensor | None]:
        """What the `gradient` memory category holds."""


class SyncToggle:
    """`no_sync()` for a gradient synchroniser: `self.enabled` is False inside it."""

    enabled: bool = True

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        before, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = before


class ChainedGradSync(SyncToggle):
    """Several synchronisers run in order (data-parallel, then tensor-parallel partial gradients)."""

    def __init__(self, parts: Sequence[GradSync]) -> None:
        self.parts = list(parts)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        with ExitStack() as stack:
            for part in self.parts:
                stack.enter_context(part.no_sync())
            yield

    def wait(self) -> None:
        for part in self.parts:
            part.wait()

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def grad_tensors(self) -> list[torch.Tensor | None]:
        return [t for part in self.parts for t in part.grad_tensors()]
