"""Each step's batch on the rank's device: its rows of the step's global batch — the synthetic chain's
(data/synthetic.py) or a data file's windows (config/data_spec.py), either way a function of (seed, step) — and,
under context parallelism, of those rows only this cp rank's tokens.

The batch is made inside the step's time (engine/train_step.py: a `data` span), so tokens/s counts it.
It is made on the host (numpy's generator, or the data file's windows), never on the GPU. On CUDA the next
step's batch is made at the end of this one — after every kernel of the step is queued, while the GPU works
through them and the host would only wait — into pinned memory, and its copy to the GPU is queued without
blocking (the copy lands after the step's kernels; the caching host allocator keeps the pinned block until it
has). The held-out batches of an evaluation go the same way, each prepared while the one before it runs
(engine/evaluate.py). No thread: a second Python thread would take the GIL from the one that launches the
kernels. On the CPU a batch is made when its step asks for it.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config import RunConfig
from workbench.data.files import TokenFile
from workbench.data.synthetic import BRANCHES, global_batch
from workbench.parallel.context_parallel import ContextParallel

Batch = tuple[torch.Tensor, torch.Tensor]


def to_device(batch: Batch, device: torch.device) -> Batch:
    """A host batch pinned, its copy to `device` queued without blocking."""
    inputs, targets = (t.pin_memory().to(device, non_blocking=True) for t in batch)
    return inputs, targets


class Batches:
    """`get(step)`: this rank's (inputs, targets) of step `step` on its device; `prepare(step)`: start making
    it now (CUDA)."""

    def __init__(
        self,
        cfg: RunConfig,
        device: torch.device,
        *,
        dp_index: int,
        dp_size: int,
        cp: ContextParallel | None = None,
        part: str = "train",
    ) -> None:
        """`part`: 'train', or 'val' for the held-out batches (index k: the k-th of the held-out stream,
        the same at every evaluation, so the curve compares like with like)."""
        self.cfg, self.device, self.cp, self.part = cfg, device, cp, part
        per = cfg.global_batch // dp_size
        self.rows = (dp_index * per, (dp_index + 1) * per)
        self.tokens = TokenFile(cfg.data, cfg.val_data, part) if cfg.data != "synthetic" else None
        self.ready: dict[int, Batch] = {}

    def resident_bytes(self) -> int:
        """What the source keeps in the rank's memory for the whole run, as its memory tracker counts it
        (under `other`): the synthetic chain's successor table on a CPU run. On a GPU the table lives in
        host memory, not the device's; a data file is memory-mapped, outside torch's allocator."""
        if self.tokens is not None or self.device.type != "cpu":
            return 0
        return 8 * self.cfg.model_config.vocab_size * BRANCHES

    def host(self, step: int) -> Batch:
        """This rank's rows (and tokens) of step `step`, in host memory."""
        cfg, m = self.cfg, self.cfg.model_config
        if self.tokens is None:
            x, y = global_batch(
                cfg.seed,
                step,
                cfg.global_batch,
                m.seq_len,
                m.vocab_size,
                rows=self.rows,
                held_out=self.part == "val",
            )
        else:
            x, y = self.tokens.global_batch(
                cfg.seed, step, cfg.global_batch, m.seq_len, rows=self.rows
            )
        if self.cp is not None:
            x, y = self.cp.shard(x), self.cp.shard(y)
        return x, y

    def prepare(self, step: int) -> None:
        """CUDA: make batch `step` now (a training step's, or the `step`-th held-out one), pinned, and queue its
        copy; nothing on the CPU, or past the last batch there will be."""
        last = self.cfg.steps if self.part == "train" else self.cfg.eval_batches
        if self.device.type != "cuda" or step >= last or step in self.ready:
            return
        self.ready[step] = to_device(self.host(step), self.device)

    def get(self, step: int) -> Batch:
        """Batch `step` on the device: the one prepared ahead, or made now."""
        batch = self.ready.pop(step, None)
        if batch is not None:
            return batch
        if self.device.type == "cuda":
            return to_device(self.host(step), self.device)
        inputs, targets = (t.contiguous() for t in self.host(step))
        return inputs, targets

    def __call__(self, step: int) -> Any:
        return self.get(step)
