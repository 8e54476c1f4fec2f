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


def zero1_step(flat_params, flat_grads, dp, update):
    n, r = dp.size, dp.rank
    per = flat_params.numel() // n
    mine = slice(
        r * per, (r + 1) * per
    )  # rank r owns the r-th 1/n: the slice the reduce-scatter leaves it
    grads = torch.empty(per, dtype=flat_grads.dtype)
    dp.reduce_scatter(
        grads, flat_grads
    )  # the sum of my slice over the ranks: (n-1)/n of S on the wire
    grads /= n  # one process's gradient is the mean over the batch: the ranks' mean
    update(flat_params[mine], grads)  # AdamW's moments for my slice only: 1/n of the state
    dp.all_gather(
        flat_params, flat_params[mine].clone()
    )  # every rank gets every slice: (n-1)/n of S


#: exercise name → its reference answer
ANSWERS: dict[str, Any] = {"ring": ring_all_reduce, "zero1": zero1_step}


def source(name: str) -> str:
    """The answer as a notebook cell would hold it."""
    answer = ANSWERS[name]
    if callable(answer):
        return inspect.getsource(answer)
    return f"{name.replace('-', '_')} = {answer!r}\n"
