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

ZeRO's synchronisers are also `ShardedGradSync`s: each rank holds slices of the parameters (`shards`, the
tensors its optimizer updates, with their facts `shard_facts`: parallel/param_facts.py), cut over `group`,
and `gather_params()` after the update brings the full parameters back (ZeRO-1/2; nothing for ZeRO-3).

`no_sync()` is PyTorch DDP's: inside it, backward only accumulates (the earlier microbatches of a
gradient-accumulation step or a pipeline schedule); the backward after it launches the collectives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Protocol

import torch
from torch import nn

from workbench.parallel.param_facts import ParamTable


class GradSync(Protocol):
    def no_sync(self) -> AbstractContextManager[None]:
        """Inside: backward accumulates gradients and launches no collective."""

    def wait(self) -> None:
        """Block until every gradient collective of this step has finished."""

    def zero_grad(self) -> None:
        """Clear the gradients for the next step (buffers are kept and zeroed where they are reused)."""

    def grad_tensors(self) -> Sequence[torch.Tensor | None]:
        """What the `gradient` memory category holds."""


class ShardedGradSync(GradSync, Protocol):
    """A GradSync whose ranks each keep slices of the parameters (ZeRO)."""

    group: str  # the group the slices were cut over ("dp", "dp_cp"; "dp" for ZeRO over dp and edp)
    shard_facts: ParamTable  # each slice's facts: its group, the runs of its elements that decay

    @property
    def shards(self) -> list[nn.Parameter]:
        """This rank's slices: what its optimizer updates (and, for ZeRO-3, all it keeps)."""

    def gather_params(self) -> None:
        """After the update: make the full parameters current again (ZeRO-1/2's all-gather)."""


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
