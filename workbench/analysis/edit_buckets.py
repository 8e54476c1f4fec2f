"""What-if edit: the data-parallel gradient buckets re-cut at another size (analysis/what_if.py). No torch."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

from workbench.analysis.collective_fit import cost, fit, replica_group
from workbench.analysis.execution_graph import Graph, Item, OpNode
from workbench.config import ConfigError
from workbench.config.buckets import plan_buckets


def rebucket(graph: Graph, bucket_mb: float, overlap: bool, notes: list[str]) -> None:
    """Each step's data-parallel buckets re-cut at `bucket_mb` (module docstring), each launched at the
    old buckets' mean launch cost. `overlap` False (a CPU whose cores the ranks fill: a collective's work
    needs the core backward holds): every bucket issued when backward ends, as one bucket was, and run one
    after another."""
    old = {
        k: n
        for k, n in graph.ops.items()
        if replica_group(n) and n.op == "all_reduce" and n.label.startswith("bucket")
    }
    if not old:
        raise ConfigError(
            "bucket_mb: the run has no data-parallel gradient buckets to re-cut (it needs dp > 1, "
            "zero=0 and the bucketed data parallel)"
        )
    ab = fit([n for n in graph.ops.values() if replica_group(n)])
    notes.append(
        f"data-parallel α {ab[0]:.0f} µs a ring step, {1 / ab[1] if ab[1] else float('inf'):.1f} "
        f"MB/s (fitted to the run's own operations)"
    )
    launches = [it.us for p in graph.programs.values() for it in p if _bucket_launch(it)]
    launch = statistics.mean(launches) if launches else 0.0
    # and one collective at a time: the worker threads have no core of their own either
    if not overlap:
        notes.append(
            "no overlap with backward, one bucket at a time: the ranks fill this machine's cores"
        )
        graph.slots = 1
    for rank, program in graph.programs.items():
        graph.programs[rank] = [
            it
            for seg in _segments(program)
            for it in _rebucket_step(
                seg,
                old,
                graph,
                fit=ab,
                bucket_mb=bucket_mb,
                launch=launch,
                overlap=overlap,
                params=graph.param_sizes.get(rank, []),
            )
        ]
    for k in old:
        graph.ops.pop(k, None)


def bucket_bytes(params: list[int], total: float, bucket_mb: float) -> list[float]:
    """The new buckets' bytes, cut as the run cuts them (config/buckets.py: whole tensors, last layers
    first) from its parameters' sizes; without them (an older trace), `total` in equal cuts."""
    per_value = total / sum(params) if params else 0.0
    if not per_value or abs(per_value - round(per_value)) > 1e-6:
        cap = bucket_mb * 2**20
        return [min(cap, total - i * cap) for i in range(max(1, math.ceil(total / cap)))]
    backward = list(reversed(params))
    return [
        sum(backward[i] for i in idxs) * per_value
        for idxs in plan_buckets(backward, round(per_value), bucket_mb)
    ]


def _bucket_launch(it: Item) -> bool:
    return (
        it.kind == "busy"
        and it.meta.get("kind") == "launch"
        and str(it.meta.get("label")).startswith("bucket")
    )


def _segments(program: list[Item]) -> list[list[Item]]:
    """The program cut before each step's start mark (order kept)."""
    out: list[list[Item]] = [[]]
    for it in program:
        if it.kind == "mark" and it.tag == "start" and out[-1]:
            out.append([])
        out[-1].append(it)
    return out


def _rebucket_step(
    items: list[Item],
    old: dict[tuple[Any, ...], OpNode],
    graph: Graph,
    *,
    fit: tuple[float, float],
    bucket_mb: float,
    launch: float,
    overlap: bool,
    params: list[int],
) -> list[Item]:
    mine = [old[it.keys[0]] for it in items if it.kind == "issue" and it.keys[0] in old]
    if not mine:
        return items
    total = sum(n.nbytes for n in mine)
    sizes = bucket_bytes(params, total, bucket_mb)
    first = mine[0]
    keys = [("c", first.group, first.members, ("bucket", first.step, i)) for i in range(len(sizes))]
    for i, (k, size) in enumerate(zip(keys, sizes, strict=True)):
        graph.ops[k] = dataclasses.replace(
            first,
            key=k,
            nbytes=int(size),
            label=f"bucket {i}",
            extra_us={},
            order=first.order + (i + 1) / (len(sizes) + 1),
            cost_us=cost("all_reduce", len(first.members), size, fit),
        )
    last_forward = max(
        (i for i, it in enumerate(items) if it.meta.get("kind") == "forward"), default=-1
    )
    backward = [
        i for i, it in enumerate(items) if i > last_forward and it.meta.get("kind") == "backward"
    ]
    span = sum(items[i].us for i in backward)
    # ready as backward produces them (or all at its end)
    at = [span * (sum(sizes[: i + 1]) / total if overlap else 1.0) for i in range(len(sizes))]
    out: list[Item] = []
    elapsed, nxt, placed_block = 0.0, 0, False
    for i, it in enumerate(items):
        if it.kind == "issue" and it.keys[0] in old or _bucket_launch(it):
            continue
        if it.kind == "block" and set(it.keys) <= old.keys():
            if not placed_block:
                out.append(
                    Item(kind="block", us=it.us, keys=tuple(keys), step=it.step, meta=dict(it.meta))
                )
                placed_block = True
            continue
        if i in backward:
            length = it.us
            while nxt < len(at) and at[nxt] <= elapsed + length + 1e-9:
                cut = max(0.0, at[nxt] - elapsed)
                out.append(dataclasses.replace(it, us=cut, meta=dict(it.meta)))
                out.append(Item(kind="issue", keys=(keys[nxt],), step=it.step))
                out.append(
                    Item(
                        kind="busy", us=launch, tag="launch", step=it.step, meta={"kind": "launch"}
                    )
                )
                elapsed, length, nxt = elapsed + cut, length - cut, nxt + 1
            out.append(dataclasses.replace(it, us=length, meta=dict(it.meta)))
            elapsed += length
            continue
        out.append(it)
    return out
