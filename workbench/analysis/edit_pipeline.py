"""What-if edit: the pipeline re-laid with another schedule, number of micro-batches or virtual stages,
by the schedule simulator (analysis/what_if.py). No torch.
"""

from __future__ import annotations

import statistics
from typing import Any

from workbench.analysis import bubble
from workbench.analysis.scaling import compute_ratio
from workbench.config import ConfigError
from workbench.schedules.build import build_schedule, simulate


def relay_pipeline(
    traces: list[dict[str, Any]],
    source: dict[str, Any],
    edited: dict[str, Any],
    changes: dict[str, Any],
    *,
    hardware: Any,
    notes: list[str],
) -> float:
    """µs the step gains (or loses) when its pipeline runs the new schedule: the simulated span of the new
    schedule less the old one's, both from the run's mean costs, transfer time and host gaps per action,
    the mean over the steps after the first and over the pipelines."""
    p, m, v = source["pp"], source["microbatches"], source["virtual_stages"]
    name = source["schedule"]
    if p == 1:
        raise ConfigError(
            f"{', '.join(changes)}: the schedule is re-laid only for a pipeline run (pp > 1); this "
            "run has pp=1"
        )
    m1, name1 = int(changes.get("microbatches", m)), changes.get("schedule", name)
    if name1 == "zbv":  # a V: two stages a rank
        v1 = 2
    elif "virtual_stages" in changes:
        v1 = int(changes["virtual_stages"])
    else:  # interleaved keeps the run's chunks; the others have one
        v1 = v if name1 == "interleaved" else 1
    layers, batch = source["model"]["layers"], source["global_batch"]
    if layers % (p * v1) or batch % (edited["dp"] * m1):
        raise ConfigError(
            f"pp={p} × virtual_stages={v1} must divide the {layers} layers and dp × microbatches="
            f"{edited['dp'] * m1} the global batch {batch}"
        )
    old, new = build_schedule(name, p, m, v), build_schedule(name1, p, m1, v1)
    rule = "nccl" if source.get("backend") == "nccl" else "gloo"
    micro = batch // (source["dp"] * m)  # both split evenly (the source ran; checked above)
    per_f, per_b = compute_ratio(source, hardware, micro, batch // (edited["dp"] * m1))
    deltas = []
    for replica in bubble.pipelines(traces, p):
        transfer = bubble.transfer_time(list(replica.values()))
        steps = bubble.step_inputs(old, replica)
        for step, inputs in sorted(steps.items())[1:] or sorted(steps.items()):
            per_rank = _rank_costs(inputs["cost"], p)
            chunk = v / v1  # a new action's share of its rank's layers
            cost = {}
            for s in range(p * v1):
                f, b = per_rank[s % p]
                f, b = f * per_f * chunk, b * per_b * chunk
                cost.update({(s, "F"): f, (s, "B"): b, (s, "I"): b / 2, (s, "W"): b / 2})
            gap, t = inputs["gap"], transfer.get(step, 0.0)
            deltas.append(
                simulate(new, cost=bubble.action_costs(cost, gap), t_comm=t, rule=rule).makespan
                - simulate(
                    old, cost=bubble.action_costs(inputs["cost"], gap), t_comm=t, rule=rule
                ).makespan
            )
    if not deltas:
        raise ConfigError("the run has no complete pipeline step to re-lay")
    notes.append(
        f"pipeline re-laid: {name} m={m} v={v} → {name1} m={m1} v={v1} (simulated from the run's costs)"
    )
    return statistics.mean(deltas)


def _rank_costs(cost: dict[tuple[int, str], float], p: int) -> dict[int, tuple[float, float]]:
    """Each pipeline rank's forward and backward (B, or I + W) of one micro-batch over all its stages."""
    out = {}
    for r in range(p):
        mine = [(s, k) for s, k in cost if s % p == r]
        f = sum(cost[(s, k)] for s, k in mine if k == "F")
        b = sum(cost[(s, k)] for s, k in mine if k in ("B", "I", "W"))
        out[r] = (f, b)
    return out
