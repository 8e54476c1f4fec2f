"""How a run's gradients are cut into buckets (parallel/data_parallel.py and parallel/zero.py cut them; the
what-if of bucket size, analysis/edit_buckets.py, cuts the same): plain arithmetic, no torch."""

from __future__ import annotations


def plan_buckets(sizes: list[int], element_size: int, bucket_mb: float) -> list[list[int]]:
    """Indices of the tensors (given in backward order) for each bucket: a bucket closes once it
    holds at least `bucket_mb` MB (a tensor larger than that gets a bucket of its own)."""
    cap = bucket_mb * 1024 * 1024
    plan: list[list[int]] = [[]]
    filled = 0
    for i, n in enumerate(sizes):
        if plan[-1] and filled + n * element_size > cap:
            plan.append([])
            filled = 0
        plan[-1].append(i)
        filled += n * element_size
    return plan
