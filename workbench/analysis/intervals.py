"""How sure a benchmark's ratio is: a 95 % interval by bootstrap over interleaved rounds.

A benchmark runs candidates A and B in alternating rounds, so that round i of each saw the same machine.
One median ratio median(A)/median(B) hides how much it moves from run to run (three runs of
dp_vs_ddp.py on a quiet 2-core machine gave 0.99, 1.04, 1.14). `ratio` resamples the rounds *in pairs*
(round i of A with round i of B, keeping what they shared), recomputes the ratio of medians each time,
and reports the 2.5th and 97.5th percentiles (Efron's percentile bootstrap), with the ratio of the
minima beside it (the least-disturbed round of each: what each costs when nothing else runs). No torch.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Ratio:
    median: float  # median(A) / median(B)
    low: float  # 95 % interval of the ratio of medians
    high: float
    by_min: float  # min(A) / min(B)
    rounds: int

    def __str__(self) -> str:
        return (
            f"{self.median:.3f}  95 % [{self.low:.3f}, {self.high:.3f}]  min-based {self.by_min:.3f}  "
            f"({self.rounds} rounds)"
        )

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def ratio(a: list[float], b: list[float], resamples: int = 2000, seed: int = 0) -> Ratio:
    """A over B, from paired rounds (a[i] and b[i] ran in the same round)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"paired rounds needed: got {len(a)} and {len(b)} (at least 2 each, the same number)"
        )
    rng = random.Random(seed)
    n = len(a)
    boot = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        boot.append(statistics.median(a[i] for i in idx) / statistics.median(b[i] for i in idx))
    boot.sort()
    return Ratio(
        median=statistics.median(a) / statistics.median(b),
        low=boot[int(0.025 * resamples)],
        high=boot[min(int(0.975 * resamples), resamples - 1)],
        by_min=min(a) / min(b),
        rounds=n,
    )


def spread(values: list[float]) -> str:
    """Several whole runs' values of one ratio: min, median and max."""
    return (
        f"min {min(values):.3f}  median {statistics.median(values):.3f}  max {max(values):.3f}  "
        f"over {len(values)} runs"
    )


def step_spread(steps: list[float]) -> float:
    """A run's ± on its median step: half the range from the 10th to the 90th percentile of its step times,
    over their median (0 with fewer than two steps)."""
    xs = sorted(steps)
    if len(xs) < 2:
        return 0.0

    def at(q: float) -> float:
        return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]

    return (at(0.9) - at(0.1)) / 2 / statistics.median(xs)
