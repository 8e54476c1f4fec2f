"""TensorBoard while it trains (`--tensorboard`): rank 0 writes one point per step into RUN/tb/ through
torch.utils.tensorboard, so `tensorboard --logdir traces/` follows a run as it goes.

    train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/step_time_s    metrics.jsonl's row
    time_ms/<category>     rank 0's time in the step by span category (forward, backward, optimizer,
                           collective, p2p, wait ...), summed from its own trace spans: measured, by the clock
    time_ms/compute, time_ms/communication                    the split: forward+backward+recompute+optimizer,
                                                               and collective+p2p+wait
    memory_MB/<category>   rank 0's peak so far of each memory category, and memory_MB/total the simultaneous
                           peak of all of them (measure/memory.py's bookkeeping)

Only rank 0 writes (its view, like metrics.jsonl); the per-rank picture stays in the traces.
"""

from __future__ import annotations

import os
from typing import Any

COMPUTE = ("forward", "backward", "recompute", "optimizer")
COMMUNICATION = ("collective", "p2p", "wait")
TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s")


class TensorBoard:
    """Opened on rank 0 before the first step; `write(row, since_us)` after each, `close()` at the end."""

    def __init__(self, run_dir: str, recorder: Any, memory: Any) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, "tb"))
        self.recorder, self.memory = recorder, memory
        self.scanned = 0  # events of the recorder already read

    def write(self, row: dict[str, Any], since_us: float) -> None:
        step = int(row["step"])
        for key in TRAIN_KEYS:
            if row.get(key) is not None:
                self.writer.add_scalar(f"train/{key}", float(row[key]), step)
        by_cat = self._time_by_category(since_us)
        for cat, ms in by_cat.items():
            self.writer.add_scalar(f"time_ms/{cat}", ms, step)
        if by_cat:
            self.writer.add_scalar("time_ms/compute", sum(by_cat.get(c, 0.0) for c in COMPUTE), step)
            self.writer.add_scalar("time_ms/communication", sum(by_cat.get(c, 0.0) for c in COMMUNICATION), step)
        for cat, value in self.memory.peak.items():
            if value:
                self.writer.add_scalar(f"memory_MB/{cat}", value / 1e6, step)
        self.writer.add_scalar("memory_MB/total", self.memory.peak_total / 1e6, step)
        self.writer.flush()

    def _time_by_category(self, since_us: float) -> dict[str, float]:
        """Milliseconds per category of rank 0's complete spans that started in this step (the step span
        itself left out)."""
        events = self.recorder.events
        end = len(events)
        out: dict[str, float] = {}
        for e in events[self.scanned:end]:
            if e.get("ph") == "X" and e["ts"] >= since_us and e["cat"] != "step":
                out[e["cat"]] = out.get(e["cat"], 0.0) + e["dur"] / 1e3
        self.scanned = end
        return out

    def close(self) -> None:
        self.writer.close()
