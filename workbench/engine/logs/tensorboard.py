"""TensorBoard while it trains (`--tensorboard`): rank 0 writes one point per step into RUN/tb/ through
torch.utils.tensorboard, so `tensorboard --logdir traces/` follows a run as it goes. The same points go to
W&B with `--wandb` (engine/logs/wandb_log.py); `StepLogs` computes them once for both.

    train/loss, train/lr, train/grad_norm, train/tokens_per_s, train/step_time_s    metrics.jsonl's row
    val/loss               the held-out loss, at the steps it was computed (--eval-every)
    time_ms/<category>     rank 0's time in the step by span category (forward, backward, optimizer,
                           collective, p2p, wait ...), summed from its own trace spans: measured, by the clock
    time_ms/compute, time_ms/communication    the split, as summary.json counts it (trace/spans.py): time
                           covered by compute spans, and by communication in flight (async included)
    memory_MB/<category>   rank 0's peak so far of each memory category, and memory_MB/total the simultaneous
                           peak of all of them (measure/memory.py's bookkeeping)

Only rank 0 writes (its view, like metrics.jsonl); the per-rank picture stays in the traces.
"""

from __future__ import annotations

import os
from typing import Any

from workbench.trace.spans import comm_intervals, compute_intervals, union_length

TRAIN_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s")


class TensorBoard:
    """RUN/tb through torch.utils.tensorboard: one point per scalar and step."""

    def __init__(self, run_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(run_dir, "tb"))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, summary_path: str | None = None) -> None:
        self.writer.close()


class StepLogs:
    """Rank 0's step points for the loggers asked for (TensorBoard, W&B: engine/logs/wandb_log.py): each step's
    events are read once from the recorder, the points computed once and handed to every logger."""

    def __init__(self, recorder: Any, memory: Any, loggers: list[Any]) -> None:
        self.recorder, self.memory, self.loggers = recorder, memory, loggers
        self.scanned = 0  # events of the recorder already read

    def write(self, row: dict[str, Any], since_us: float) -> None:
        end = len(self.recorder.events)
        events, self.scanned = self.recorder.events[self.scanned : end], end
        scalars = step_scalars(row, events, since_us, self.memory)
        for logger in self.loggers:
            logger.write(int(row["step"]), scalars)

    def close(self, summary_path: str | None = None) -> None:
        for logger in self.loggers:
            logger.close(summary_path)


def step_scalars(
    row: dict[str, Any], events: list[dict[str, Any]], since_us: float, memory: Any
) -> dict[str, float]:
    """What is logged for a step (TensorBoard's and W&B's points): metrics.jsonl's row, rank 0's time by span
    category and the compute/communication split of the step's events, the memory categories' peaks so far."""
    out = {f"train/{key}": float(row[key]) for key in TRAIN_KEYS if row.get(key) is not None}
    # the steps the held-out loss was computed at (engine/evaluate.py)
    if row.get("val_loss") is not None:
        out["val/loss"] = float(row["val_loss"])
    for cat, ms in _time_by_category(events, since_us).items():
        out[f"time_ms/{cat}"] = ms
    if events:
        comm = [(a, b) for _, a, b in comm_intervals(events) if a >= since_us]
        out["time_ms/compute"] = union_length(compute_intervals(events, since_us)) / 1e3
        out["time_ms/communication"] = union_length(comm) / 1e3
    for cat, value in memory.peak.items():
        if value:
            out[f"memory_MB/{cat}"] = value / 1e6
    out["memory_MB/total"] = memory.peak_total / 1e6
    return out


def _time_by_category(events: list[dict[str, Any]], since_us: float) -> dict[str, float]:
    """Milliseconds per category of the complete spans that started in the step (the step span left out)."""
    out: dict[str, float] = {}
    for e in events:
        if e.get("ph") == "X" and e["ts"] >= since_us and e["cat"] != "step":
            out[e["cat"]] = out.get(e["cat"], 0.0) + e["dur"] / 1e3
    return out
