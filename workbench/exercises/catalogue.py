"""The exercises, in the order a learner meets them (the notebook's order)."""

from __future__ import annotations

from workbench.exercises import ring, tensor_parallel
from workbench.exercises.exercise import Exercise

EXERCISES: dict[str, Exercise] = {e.name: e for e in (ring.EXERCISE, tensor_parallel.EXERCISE)}
