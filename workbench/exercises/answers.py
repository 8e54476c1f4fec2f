"""The reference answers, one per exercise: what `check` runs beside the learner's solution, and what the
notebook's test fills into its empty cells (scripts/exercise_answers.py). A notebook never prints them."""

from __future__ import annotations

import inspect
from typing import Any


def ring_all_reduce(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1):  # reduce-scatter: pass on the running sum that just grew
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):  # all-gather: pass on the complete chunk
        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))


def on_gradient(param, dp):
    bucket = dp.bucket_of(param)
    param.grad.div_(dp.size)  # the all-reduce sums: the step wants the ranks' mean
    bucket.ready.add(param)
    if len(bucket.ready) == len(bucket.params):  # its last gradient: launch while backward goes on
        dp.all_reduce(bucket)


#: exercise name → its reference answer
ANSWERS: dict[str, Any] = {"ring": ring_all_reduce}
ANSWERS["buckets"] = on_gradient


def source(name: str) -> str:
    """The answer as a notebook cell would hold it."""
    answer = ANSWERS[name]
    if callable(answer):
        return inspect.getsource(answer)
    return f"{name.replace('-', '_')} = {answer!r}\n"
