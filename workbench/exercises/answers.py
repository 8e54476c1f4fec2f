"""The reference answers, one per exercise: what `check` runs beside the learner's solution, and what the
notebook's test fills into its empty cells (scripts/exercise_answers.py). A notebook never prints them."""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch


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


def zero1_step(flat_params, flat_grads, dp, update):
    n, r = dp.size, dp.rank
    per = flat_params.numel() // n
    # rank r owns the r-th 1/n: the slice the reduce-scatter leaves it
    mine = slice(r * per, (r + 1) * per)
    # the sum of my slice over the ranks: (n−1)/n of S on the wire
    grads = torch.empty(per, dtype=flat_grads.dtype)
    dp.reduce_scatter(grads, flat_grads)
    grads /= n  # one process's gradient is the mean over the batch: the ranks' mean
    update(flat_params[mine], grads)  # AdamW's moments for my slice only: 1/n of the state
    # every rank gets every slice: (n−1)/n of S
    dp.all_gather(flat_params, flat_params[mine].clone())


def tp_mlp(x, w1, w2, tp):
    per = w1.size(0) // tp.size  # the hidden units on each rank
    mine = slice(tp.rank * per, (tp.rank + 1) * per)
    hidden = torch.nn.functional.gelu(tp.f(x) @ w1[mine].t())  # column-parallel: w1's rows
    return tp.g(hidden @ w2[:, mine].t())  # row-parallel: w2's columns, the partial sums summed


# 1F1B, p = 4, m = 8: rank r runs p − r − 1 forwards (warm-up), then one forward and one backward in turn
# (steady state), then the backwards left (cool-down)
# fmt: off
one_f_one_b = [
    ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5", "B2", "F6", "B3", "F7", "B4", "B5", "B6", "B7"],
    ["F0", "F1", "F2", "B0", "F3", "B1", "F4", "B2", "F5", "B3", "F6", "B4", "F7", "B5", "B6", "B7"],
    ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "F4", "B3", "F5", "B4", "F6", "B5", "F7", "B6", "B7"],
    ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "F4", "B4", "F5", "B5", "F6", "B6", "F7", "B7"],
]
# fmt: on


def checkpoint_interval(checkpoint_s, failures_per_node_day, nodes):
    mtbf_s = 86_400 / (failures_per_node_day * nodes)  # the job stops when any node fails
    return math.sqrt(2 * checkpoint_s * mtbf_s)  # Young's; Daly's − checkpoint_s passes too


#: exercise name → its reference answer
ANSWERS: dict[str, Any] = {
    "ring": ring_all_reduce,
    "buckets": on_gradient,
    "zero1": zero1_step,
    "tensor-parallel": tp_mlp,
    "pipeline": one_f_one_b,
    "checkpoint-interval": checkpoint_interval,
}

#: the variable a table answer's cell assigns, where it is not the exercise's name
VARIABLES: dict[str, str] = {"pipeline": "one_f_one_b"}


def source(name: str) -> str:
    """The answer as a notebook cell would hold it."""
    answer = ANSWERS[name]
    if callable(answer):
        return inspect.getsource(answer)
    variable = VARIABLES.get(name, name.replace("-", "_"))
    if isinstance(answer, list) and all(isinstance(row, list) for row in answer):
        rows = "".join(f"    {row!r},\n" for row in answer)  # a table: one row a line
        return f"{variable} = [\n{rows}]\n"
    return f"{variable} = {answer!r}\n"
