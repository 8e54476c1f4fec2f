"""Benchmark ratios come with a bootstrap interval (workbench/analysis/intervals.py)."""

from __future__ import annotations

import random

import pytest

from workbench.analysis.intervals import ratio, spread


def _rounds(n: int, true_ratio: float, noise: float, seed: int) -> tuple[list[float], list[float]]:
    """Paired rounds: a machine-wide disturbance shared by both candidates in a round, plus their own."""
    rng = random.Random(seed)
    a, b = [], []
    for _ in range(n):
        shared = rng.expovariate(1 / noise)
        b.append(1.0 + shared + rng.gauss(0, noise / 4))
        a.append(true_ratio * (1.0 + shared) + rng.gauss(0, noise / 4))
    return a, b


def test_the_interval_covers_the_true_ratio_about_95_times_in_100():
    covered = sum(
        ratio(*_rounds(40, 1.1, 0.2, seed), resamples=400).contains(1.1) for seed in range(100)
    )
    assert 85 <= covered <= 100, covered


def test_the_interval_narrows_with_rounds_and_holds_the_minimum_ratio():
    few, many = ratio(*_rounds(10, 1.0, 0.3, 1)), ratio(*_rounds(200, 1.0, 0.3, 1))
    assert many.high - many.low < few.high - few.low
    assert few.low <= few.median <= few.high
    a, b = [2.0, 3.0, 9.0], [1.0, 2.0, 1.5]
    assert ratio(a, b).by_min == pytest.approx(2.0)
    assert "95 %" in str(ratio(a, b)) and "over 3 runs" in spread([1.0, 1.1, 0.9])


def test_unpaired_rounds_are_refused():
    with pytest.raises(ValueError, match="paired"):
        ratio([1.0, 2.0], [1.0])
