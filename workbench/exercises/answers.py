"""The reference answers, one per exercise: what `check` runs beside the learner's solution, and what the
notebook's test fills into its empty cells (scripts/exercise_answers.py). A notebook never prints them."""

from __future__ import annotations

import inspect
import math
from typing import Any


def ring_all_reduce(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1):  # reduce-scatter: pass on the running sum that just grew
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):  # all-gather: pass on the complete chunk
        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))


def checkpoint_interval(checkpoint_s, failures_per_node_day, nodes):
    mtbf_s = 86_400 / (failures_per_node_day * nodes)  # the job stops when any node fails
    return math.sqrt(2 * checkpoint_s * mtbf_s)  # Young's; Daly's − checkpoint_s passes too


#: exercise name → its reference answer
ANSWERS: dict[str, Any] = {"ring": ring_all_reduce}
ANSWERS["checkpoint-interval"] = checkpoint_interval


def source(name: str) -> str:
    """The answer as a notebook cell would hold it."""
    answer = ANSWERS[name]
    if callable(answer):
        return inspect.getsource(answer)
    return f"{name.replace('-', '_')} = {answer!r}\n"
