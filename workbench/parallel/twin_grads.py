"""DualPipe's two copies of the model kept one model (DeepSeek-V3, 2024, §3.2.1; deepseek-ai/DualPipe's
example sums each copy's gradients with the other's before the update).

DualPipe runs two pipelines over the same pp ranks, one down the row and one up it (schedules/dualpipe.py):
part k of the model is held twice, as stage k on pp rank k and as stage pp + k on pp rank pp − 1 − k.
Each copy's backward sees only the microbatches of its own pipeline, so after backward each copy holds
half of the gradient. `TwinGradients.wait` makes both whole: pp rank r and its twin pp − 1 − r, which
hold the same two parts, swap their parts' gradients in one point-to-point exchange over the `pp` group
(each sends all of its gradients once, as a two-rank all-reduce would) and each adds the other's. Both
add the same two numbers (a + b = b + a, exactly), so both copies take the same update and stay equal.

Memory: the exchange packs the rank's gradients into one flat buffer and receives the twin's into
another, `comm_buffer` for the exchange's duration (2× the rank's gradient bytes, after backward, when
the activations are gone; predict/formulas/run.py counts the same).

Sharded: nothing — each rank holds its two parts whole (ZeRO over dp composes with it only at zero=0:
config/pipeline_rules.py). Collectives: none in forward; after backward (and after the data-parallel
all-reduce, which it commutes with) one send and one receive of the rank's gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.parallel.flat import pack, unpack
from workbench.parallel.grad_sync import SyncToggle
from workbench.parallel.main_grad import MainGrads


class TwinGradients(SyncToggle):
    """The `GradSync` that sums DualPipe's twin copies' gradients (module docstring). `chunks`: this
    rank's stages by part of the model (the twin lists the same parts in the same order), `twin`: the
    twin's global rank."""

    def __init__(
        self,
        chunks: Sequence[nn.Module],
        comm: Communicator,
        *,
        twin: int,
        main_grads: MainGrads | None = None,
        memory: MemoryCounter = NO_MEMORY,
    ) -> None:
        self.params = [p for c in chunks for p in c.parameters()]
        self.comm, self.twin, self.memory = comm, twin, memory
        self.main_grads = MainGrads() if main_grads is None else main_grads

    def wait(self) -> None:
        grads = [self.main_grads.grad_of(p) for p in self.params]
        present = [g for g in grads if g is not None]
        if len(present) != len(grads):
            raise RuntimeError(
                "DualPipe twin gradients: a parameter has no gradient after backward"
            )
        mine = pack(present)
        theirs = torch.empty_like(mine)
        buffers = 2 * mine.numel() * mine.element_size()
        self.memory.add("comm_buffer", buffers)
        self.memory.snapshot()
        self.comm.batch_isend_irecv(
            [
                ("send", mine, self.twin, "twin gradients"),
                ("recv", theirs, self.twin, "twin gradients"),
            ],
            "pp",
        ).wait()
        mine.add_(theirs)
        unpack(mine, present)
        self.memory.add("comm_buffer", -buffers)

    def zero_grad(self) -> None:
        return None  # the data-parallel synchroniser owns and zeroes the gradients

    def grad_tensors(self) -> list[torch.Tensor | None]:
        return []
