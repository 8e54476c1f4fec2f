"""What goes wrong in training, and when to give up.

Loss-spike detection: a step whose loss of the global batch jumps above `factor` × the median of the
last `window` accepted steps is skipped — its gradients (from a corrupted batch, or a numerical blow-up)
never reach the weights. Every rank holds the same global loss (it is all-reduced before the update), so
every rank decides the same. The other anomaly, a non-finite gradient norm, is the updaters' own
(optim/updater.py). The window starts empty on resume.

`Divergence`: a run that cannot recover stops, rather than skipping every step to the end and finishing
"ok" with a NaN loss — after K skipped updates in a row, or at once where the parameters are no longer
finite.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any


class LossSpike:
    """Skips a step whose loss jumps above `factor` × the median of the last `window` accepted ones (after
    `warmup` of them); built by `parallelize` where loss_spike_factor is set."""

    def __init__(self, factor: float, *, window: int = 10, warmup: int = 3) -> None:
        self.factor, self.warmup = factor, warmup
        self.history: deque[float] = deque(maxlen=window)

    def check(self, loss: float) -> bool:
        """True when `loss` is a spike (not added to the history); else record it."""
        if len(self.history) >= self.warmup and loss > self.factor * statistics.median(
            self.history
        ):
            return True
        self.history.append(loss)
        return False


class TrainingStopped(RuntimeError):
    """The run cannot recover: the message names the first bad step and the likely cause (engine/train.py
    raises it on every rank at the same step — each holds the same global facts)."""


@dataclass(kw_only=True)
class Divergence:
    """When to give up (`RunConfig.max_skipped_steps`): K skipped updates in a row — a non-finite gradient norm,
    or a loss spike —, parameters that are no longer finite, or fp16's loss scale fallen below 1 (overflowing
    whatever the scale). fp16's overflow skips are loss scaling at work and do not count toward K.

    `observe(step, result, params_finite)` after each step; raises TrainingStopped, naming the first step of
    the run of bad ones and what it showed."""

    max_skipped: int
    lr: float
    #: (step, what it showed) of the skips in a row
    run: list[tuple[int, str]] = field(default_factory=list)

    def observe(
        self, step: int, loss: float, facts: dict[str, Any], params_finite: bool | None
    ) -> None:
        if params_finite is False:
            raise TrainingStopped(
                f"step {step}: the parameters are no longer finite (inf or NaN) — the update "
                f"itself went wrong: a learning rate too high for this model (lr={self.lr:g}) or "
                f"a non-finite input; the run cannot recover"
            )
        scale = facts.get("loss_scale")
        if scale is not None and scale < 1.0:
            raise TrainingStopped(
                f"step {step}: fp16's loss scale fell to {scale:g}: the gradients overflow "
                f"fp16 whatever the scale (lr={self.lr:g} too high, or train in bf16)"
            )
        anomaly = facts.get("anomaly")
        if not facts.get("skipped") or anomaly is None:
            self.run.clear()
            return
        self.run.append((step, self._cause(loss, anomaly)))
        if self.max_skipped and len(self.run) >= self.max_skipped:
            first, cause = self.run[0]
            raise TrainingStopped(
                f"{len(self.run)} steps skipped in a row, from step {first}: {cause}; the run "
                f"cannot recover (max_skipped_steps={self.max_skipped})"
            )

    def _cause(self, loss: float, anomaly: str) -> str:
        if anomaly == "loss spike":
            return (
                f"the loss spiked (loss_spike_factor) — a corrupted batch, or a learning rate too high "
                f"(lr={self.lr:g})"
            )
        if not math.isfinite(loss):
            return (
                f"the loss was {loss} — the parameters diverged (lr={self.lr:g} too high?) or the data "
                f"holds a bad token"
            )
        return (
            f"the gradient norm was not finite with a finite loss {loss:.4g} — an overflow in backward, or "
            f"gradients exploding (lr={self.lr:g})"
        )
