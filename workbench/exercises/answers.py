"""The reference answers, one per exercise: what `check` runs beside the learner's solution, and what the
notebook's test fills into its empty cells (scripts/exercise_answers.py). A notebook never prints them."""

from __future__ import annotations

import inspect
from typing import Any

import torch


def ring_all_reduce(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1):  # reduce-scatter: pass on the running sum that just grew
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):  # all-gather: pass on the complete chunk
        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))


def tp_mlp(x, w1, w2, tp):
    per = w1.size(0) // tp.size  # the hidden units on each rank
    mine = slice(tp.rank * per, (tp.rank + 1) * per)
    hidden = torch.nn.functional.gelu(tp.f(x) @ w1[mine].t())  # column-parallel: w1's rows
    return tp.g(hidden @ w2[:, mine].t())  # row-parallel: w2's columns, the partial sums summed


#: exercise name → its reference answer
ANSWERS: dict[str, Any] = {"ring": ring_all_reduce}
ANSWERS["tensor-parallel"] = tp_mlp


def source(name: str) -> str:
    """The answer as a notebook cell would hold it."""
    answer = ANSWERS[name]
    if callable(answer):
        return inspect.getsource(answer)
    return f"{name.replace('-', '_')} = {answer!r}\n"
