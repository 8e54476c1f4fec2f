"""Loss-spike detection: a step whose loss of the global batch jumps above `factor` × the median of the
last `window` accepted steps is skipped — its gradients (from a corrupted batch, or a numerical blow-up)
never reach the weights. Every rank holds the same global loss (it is all-reduced before the update), so
every rank decides the same. The other anomaly, a non-finite gradient norm, is the updaters' own
(optim/updater.py). The window starts empty on resume.
"""

from __future__ import annotations

import statistics
from collections import deque


class LossSpike:
    def __init__(self, factor: float, window: int = 10, warmup: int = 3) -> None:
        self.factor, self.warmup = factor, warmup
        self.history: deque[float] = deque(maxlen=window)

    def check(self, loss: float) -> bool:
        """True when `loss` is a spike (not added to the history); else record it."""
        if len(self.history) >= self.warmup and loss > self.factor * statistics.median(self.history):
            return True
        self.history.append(loss)
        return False
