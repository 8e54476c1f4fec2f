"""What-if edit: the pipeline re-laid with another schedule (1F1B, GPipe, interleaved, ZB-H1, ZBV, DualPipe,
DualPipeV), number of micro-batches or virtual stages, by the schedule simulator (analysis/what_if.py):
each new stage costs what the run spent on its layers, each rank's host time per send is kept. No torch.
"""

from __future__ import annotations

import statistics
from typing import Any

from workbench.analysis import bubble
from workbench.analysis.scaling import compute_ratio
from workbench.config import ConfigError
from workbench.schedules.build import COMPUTE, Schedule, build_schedule, simulate


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
    the mean over the steps after the first and over the pipelines. Each new stage costs what the run's
    stages spent on the same layers (`stage_costs`): DualPipeV's, ZBV's or interleaving's half-stages half a
    1F1B stage, DualPipe's stages (1/p of a copy) a whole one each."""
    p, m, v = source["pp"], source["microbatches"], source["virtual_stages"]
    name = source["schedule"]
    if p == 1:
        raise ConfigError(
            f"{', '.join(changes)}: the schedule is re-laid only for a pipeline run (pp > 1); this "
            "run has pp=1"
        )
    m1, name1 = int(changes.get("microbatches", m)), changes.get("schedule", name)
    if name1 in ("zbv", "dualpipe", "dualpipev"):  # two stages a rank
        v1 = 2
    elif "virtual_stages" in changes:
        v1 = int(changes["virtual_stages"])
    else:  # interleaved keeps the run's chunks; the others have one
        v1 = v if name1 == "interleaved" else 1
    layers, batch = source["model"]["layers"], source["global_batch"]
    parts = p if name1 == "dualpipe" else p * v1  # DualPipe: each copy in p parts
    if layers % parts or batch % (edited["dp"] * m1):
        raise ConfigError(
            f"{name1} cuts the model in {parts} stages, which must divide the {layers} layers, and dp × "
            f"microbatches={edited['dp'] * m1} must divide the global batch {batch}"
        )
    if name1 == "dualpipe" and (source.get("zero", 0) or source["model"].get("experts", 0)):
        raise ConfigError(
            f"what-if schedule='dualpipe' on a run with zero={source.get('zero', 0)}, model.experts="
            f"{source['model'].get('experts', 0)}: DualPipe runs with zero=0 and a dense model "
            f"(config/pipeline_rules.py); try schedule='dualpipev'"
        )
    try:
        old, new = build_schedule(name, p, m, v), build_schedule(name1, p, m1, v1)
    except ValueError as e:
        raise ConfigError(f"what-if schedule={name1!r}, microbatches={m1}: {e}") from None
    rule = "nccl" if source.get("backend") == "nccl" else "gloo"
    micro = batch // (source["dp"] * m)  # both split evenly (the source ran; checked above)
    per_f, per_b = compute_ratio(source, hardware, micro, batch // (edited["dp"] * m1))
    deltas = []
    for replica in bubble.pipelines(traces, p):
        transfer = bubble.transfer_time(list(replica.values()))
        steps = bubble.step_inputs(old, replica)
        for step, inputs in sorted(steps.items())[1:] or sorted(steps.items()):
            cost = {}
            for s, (f, b) in stage_costs(old, new, inputs["cost"]).items():
                f, b = f * per_f, b * per_b
                cost.update({(s, "F"): f, (s, "B"): b, (s, "I"): b / 2, (s, "W"): b / 2})
            gap, t = inputs["gap"], transfer.get(step, 0.0)
            deltas.append(
                simulate(
                    new,
                    cost=bubble.action_costs(cost, posting_gap(old, new, gap)),
                    t_comm=t,
                    rule=rule,
                ).makespan
                - simulate(
                    old, cost=bubble.action_costs(inputs["cost"], gap), t_comm=t, rule=rule
                ).makespan
            )
    if not deltas:
        raise ConfigError("the run has no complete pipeline step to re-lay")
    notes.append(
        f"pipeline re-laid: {name} m={m} v={v} → {name1} m={m1} v={v1} (simulated from the run's costs)"
    )
    if new.placement == "dual":
        notes.append(
            "not counted: DualPipe's twin-gradient exchange (each rank's whole gradient, once a step) "
            "and its optimizer over twice the parameters"
        )
    return statistics.mean(deltas)


def posting_gap(old: Schedule, new: Schedule, gap: dict[int, float]) -> dict[int, float]:
    """Each rank's host gap per compute action under `new`, from the run's under `old`: the rank's host
    time per send is kept, spread over the new schedule's actions. Posting sends is what the gap holds (a
    recorded gloo send's launch takes milliseconds on a loaded CPU, a receive's tens of µs), so a
    schedule with more compute actions but the same sends (ZB-H1's W) keeps the step's host time, and a
    V or DualPipe, whose ranks send twice 1F1B's transfers, doubles it."""
    out = {}
    for r, g in gap.items():
        ratio = []  # sends per compute action
        for s in (old, new):
            actions = sum(a.kind in COMPUTE for a in s.actions[r])
            ratio.append(sum(a.is_send for a in s.actions[r]) / max(actions, 1))
        out[r] = g / ratio[0] * ratio[1] if ratio[0] else g
    return out


def stage_costs(
    old: Schedule, new: Schedule, cost: dict[tuple[int, str], float]
) -> dict[int, tuple[float, float]]:
    """Each stage of `new`: its forward and backward (B, or I + W) of one microbatch, from the measured
    `cost` per (stage, kind) of `old` — the share of each old part of the model the new stage's part covers
    (parts by `Schedule.model_part`: the same layers cost the same; DualPipe's two copies of a part
    averaged)."""
    n0 = old.model_part(0)[1]
    measured: dict[int, list[tuple[float, float]]] = {}
    for s in range(old.stages):
        f = cost.get((s, "F"), 0.0)
        b = sum(cost.get((s, k), 0.0) for k in ("B", "I", "W"))
        measured.setdefault(old.model_part(s)[0], []).append((f, b))
    per_part = {
        j: (statistics.mean(f for f, _ in fb), statistics.mean(b for _, b in fb))
        for j, fb in measured.items()
    }
    out = {}
    for s in range(new.stages):
        k, n1 = new.model_part(s)
        f = b = 0.0
        for j, (fj, bj) in per_part.items():
            # the overlap of [k/n1, (k+1)/n1) with old part j's [j/n0, (j+1)/n0), in old parts
            share = max(0.0, min((k + 1) / n1, (j + 1) / n0) - max(k / n1, j / n0)) * n0
            f, b = f + share * fj, b + share * bj
        out[s] = (f, b)
    return out
