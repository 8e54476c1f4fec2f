"""The exercises, in the order a learner meets them (the notebook's order)."""

from __future__ import annotations

from workbench.exercises import (
    buckets,
    checkpoint_interval,
    pipeline,
    ring,
    tensor_parallel,
    zero1,
)
from workbench.exercises.exercise import Exercise

EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in (
        ring.EXERCISE,
        buckets.EXERCISE,
        zero1.EXERCISE,
        tensor_parallel.EXERCISE,
        pipeline.EXERCISE,
        checkpoint_interval.EXERCISE,
    )
}
