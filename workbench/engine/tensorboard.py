"""TensorBoard while it trains (`--tensorboard`): rank 0 writes one point per step into RUN/tb/ through
torch.utils.tensorboard, so `tensorboard --logdir traces/` follows a run as it goes.

    train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/step_time_s    metrics.jsonl's row
    time_ms/<category>     rank 0's time in the step by span category (forward, backward, optimizer,
                           collective, p2p, wait ...), summed from its own trace spans: measured, by the clock
    time_ms/compute, time_ms/communication    the split, as summary.json counts it (analysis/summary.py): time
                           covered by compute spans, and by communication in flight (async included)
    memory_MB/<category>   rank 0's peak so far of each memory category, and memory_MB/total the simultaneous
                           peak of all of them (measure/memory.py's bookkeeping)

Only rank 0 writes (its view, like metrics.jsonl); the per-rank picture stays in the traces.
"""

from __future__ import annotations

import os
from typing import Any

from workbench.analysis.summary import comm_intervals, compute_intervals, union_length

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
        events = self._events_of_step()
        for cat, ms in _time_by_category(events, since_us).items():
            self.writer.add_scalar(f"time_ms/{cat}", ms, step)
        if events:
            comm = [(a, b) for _, a, b in comm_intervals(events) if a >= since_us]
            self.writer.add_scalar("time_ms/compute", union_length(compute_intervals(events, since_us)) / 1e3, step)
            self.writer.add_scalar("time_ms/communication", union_length(comm) / 1e3, step)
        for cat, value in self.memory.peak.items():
            if value:
                self.writer.add_scalar(f"memory_MB/{cat}", value / 1e6, step)
        self.writer.add_scalar("memory_MB/total", self.memory.peak_total / 1e6, step)
        self.writer.flush()

    def _events_of_step(self) -> list[dict[str, Any]]:
        """The recorder's events since the last call (each event is read once)."""
        end = len(self.recorder.events)
        events, self.scanned = self.recorder.events[self.scanned:end], end
        return events

    def close(self) -> None:
        self.writer.close()


def _time_by_category(events: list[dict[str, Any]], since_us: float) -> dict[str, float]:
    """Milliseconds per category of the complete spans that started in the step (the step span left out)."""
    out: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and e["ts"] >= since_us and e["cat"] != "step":
            out[e["cat"]] = out.get(e["cat"], 0.0) + e["dur"] / 1e3
    return out
