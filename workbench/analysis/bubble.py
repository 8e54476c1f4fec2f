"""The pipeline bubble three ways, side by side in summary.json's `bubble_fraction`:

    measured                        per step: 1 − a rank's forward+backward time / the span from the first
                                    to the last compute action of any rank, averaged over ranks; the median
                                    over the steps after the first (which pays one-off costs)
    predicted                       the formula (p − 1)/(v·m + p − 1): equal costs, free transfers
    simulated_with_measured_costs   the schedule replayed by the simulator with this run's own costs, per
                                    step: each compute action's measured time to the rank's next one (the
                                    time it spent waiting left out: the simulator decides the waits), the
                                    compute part of forwards and backwards, and when each rank entered the
                                    step (ranks do not start together); transfers are free

The gap between `predicted` and `simulated_with_measured_costs` is what this machine's uneven costs do to
the formula's ideal (slower first and last stages, per-microbatch transfers on the critical path, ranks
entering the step late); the gap between `simulated_with_measured_costs` and `measured` is what the
simulator leaves out (a rank descheduled inside an action it was only waiting in). No torch.
"""

from __future__ import annotations

import statistics
from typing import Any

from workbench.predict import formulas
from workbench.pipeline.schedule import Action, Schedule, simulate
from workbench.trace.recorder import LANES

Intervals = list[tuple[float, float]]


def idle_fraction(per_rank: list[Intervals]) -> float:
    """1 − busy / window, averaged over ranks; the window runs from the first busy moment of any rank to
    the last."""
    start = min(a for iv in per_rank for a, _ in iv)
    end = max(b for iv in per_rank for _, b in iv)
    return statistics.mean(1 - sum(b - a for a, b in iv) / (end - start) for iv in per_rank)


def _compute_spans(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("forward", "backward")
            and e.get("tid") == LANES["compute"]]


def measured_per_step(traces: list[dict[str, Any]]) -> dict[int, float]:
    per_step: dict[int, dict[int, Intervals]] = {}
    for t in traces:
        rank = t["distributedInfo"]["rank"]
        for e in _compute_spans(t):
            per_step.setdefault(e["args"].get("step", 0), {}).setdefault(rank, []).append((e["ts"], e["ts"] + e["dur"]))
    return {step: idle_fraction(list(ranks.values())) for step, ranks in sorted(per_step.items())}


def _step_costs(sched: Schedule, schedule_spans: dict[int, list[dict]], compute: dict[int, dict],
                waits: dict[int, Intervals]) -> dict[tuple[int, str], tuple[float, float]]:
    """(advance, busy) of every program item of one step, keyed by (pipeline rank, item label): a compute
    action advances the rank's clock from its start to the next compute action's, less the time the rank
    spent waiting in between (the simulator makes its own waits), and is busy for its measured forward or
    backward; posting a batch of transfers costs nothing of its own (its time is in that advance)."""
    costs: dict[tuple[int, str], tuple[float, float]] = {}
    for r, spans in schedule_spans.items():
        items = list(zip(sched.program(r), spans, strict=True))
        starts = [e["ts"] for item, e in items if isinstance(item, Action)] + [spans[-1]["ts"] + spans[-1]["dur"]]
        k = 0
        for item, e in items:
            if not isinstance(item, Action):
                costs[(r, str(item))] = (0.0, 0.0)
                continue
            end = max(starts[k + 1], e["ts"] + e["dur"])
            waited = sum(max(0.0, min(b, end) - max(a, e["ts"])) for a, b in waits.get(r, []))
            busy = compute.get(r, {}).get((item.stage, item.microbatch, item.kind), e["dur"])
            costs[(r, str(item))] = (max(end - e["ts"] - waited, busy), busy)
            k += 1
    return costs


def simulated_per_step(sched: Schedule, traces: list[dict[str, Any]]) -> dict[int, float]:
    """The simulator with each step's measured costs, run for every data- and tensor-parallel replica's
    pipeline ranks; per step, the mean over replicas (as `measured` averages over all ranks)."""
    replicas: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for t in traces:
        w = t["workbench"]
        replicas.setdefault((w["dp"], w["tp"]), {})[w["pp"]] = t
    per_step: dict[int, list[float]] = {}
    for replica in replicas.values():
        if sorted(replica) == list(range(sched.p)):
            for step, value in _simulate_replica(sched, replica).items():
                per_step.setdefault(step, []).append(value)
    return {step: statistics.mean(v) for step, v in sorted(per_step.items()) if len(v) == len(replicas)}


def _simulate_replica(sched: Schedule, replica: dict[int, dict[str, Any]]) -> dict[int, float]:
    spans: dict[int, dict[int, list[dict]]] = {}
    compute: dict[int, dict[int, dict]] = {}
    waits: dict[int, dict[int, Intervals]] = {}
    for r, t in replica.items():
        for e in t["traceEvents"]:
            if e.get("ph") == "X" and e.get("tid") == LANES["schedule"]:
                spans.setdefault(e["args"]["step"], {}).setdefault(r, []).append(e)
            elif e.get("ph") == "X" and e.get("tid") == LANES["wait"] and e.get("cat") == "wait":
                waits.setdefault(e["args"].get("step", -1), {}).setdefault(r, []).append((e["ts"], e["ts"] + e["dur"]))
        for e in _compute_spans(t):
            kind = "F" if e["cat"] == "forward" else "B"
            key = (e["args"].get("stage", 0), e["args"].get("microbatch", 0), kind)
            compute.setdefault(e["args"].get("step", 0), {}).setdefault(r, {})[key] = e["dur"]
    transfer_us = transfer_time(list(replica.values()))
    out = {}
    for step, by_rank in sorted(spans.items()):
        if len(by_rank) != sched.p or any(len(v) != len(sched.program(r)) for r, v in by_rank.items()):
            continue  # an interrupted step
        ordered = {r: sorted(v, key=lambda e: e["ts"]) for r, v in by_rank.items()}
        costs = _step_costs(sched, ordered, compute.get(step, {}), waits.get(step, {}))
        first = min(v[0]["ts"] for v in ordered.values())
        start = [ordered[r][0]["ts"] - first for r in range(sched.p)]
        timeline = simulate(sched, cost=lambda r, a, c=costs: c[(r, str(a))], start=start,
                            t_comm=transfer_us.get(step, 0.0))
        out[step] = idle_fraction([[(b, e) for _, b, e in rank] for rank in timeline.spans])
    return out


def transfer_time(traces: list[dict[str, Any]]) -> dict[int, float]:
    """Per step, what a transfer between pipeline ranks costs the rank that waits for it: the median, over
    the step's transfers, of the receiving wait's end less the later of the wait's start and the send's
    posting (a receiver that came late waited less than the transfer took; one that came early waited for
    the send to be posted, then for the transfer). Clamped at 0: ranks' clocks agree to a few hundred µs."""
    posted: dict[int, float] = {}
    arrived: dict[int, tuple[int, float, float]] = {}  # flow → (step, its wait's start and end)
    for t in traces:
        waits = sorted((e["ts"], e["ts"] + e["dur"], e["args"].get("step", -1)) for e in t["traceEvents"]
                       if e.get("ph") == "X" and e.get("cat") == "wait" and e.get("tid") == LANES["wait"])
        for e in t["traceEvents"]:
            if e.get("cat") != "p2p" or e.get("ph") not in ("s", "f"):
                continue
            if e["ph"] == "s":
                posted[e["id"]] = e["ts"]
                continue
            around = [w for w in waits if w[0] <= e["ts"] <= w[1]]
            if around:
                arrived[e["id"]] = (around[-1][2], around[-1][0], around[-1][1])
    per_step: dict[int, list[float]] = {}
    for flow, (step, start, end) in arrived.items():
        if flow in posted:
            per_step.setdefault(step, []).append(max(end - max(start, posted[flow]), 0.0))
    return {step: statistics.median(v) for step, v in per_step.items()}


def _after_first(per_step: dict[int, float]) -> list[float]:
    return [v for k, v in per_step.items() if k > 0 or len(per_step) == 1]


def bubble(config: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    sched = formulas.run_schedule(config)
    measured = _after_first(measured_per_step(traces))
    simulated = _after_first(simulated_per_step(sched, traces))
    return {"measured": statistics.median(measured) if measured else None,
            "measured_per_step": measured,
            "predicted": formulas.bubble_fraction(sched.p, sched.m, sched.v),
            "simulated_with_measured_costs": statistics.median(simulated) if simulated else None,
            "simulated_per_step": simulated}

