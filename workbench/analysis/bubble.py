"""The pipeline bubble measured, and explained term by term, in summary.json's `bubble_fraction`:

    measured                        per step: 1 − a rank's forward+backward time / the span from its
                                    pipeline's first to last compute action, averaged over the ranks of each
                                    pipeline and over the pipelines (data- and tensor-parallel replicas); the
                                    median over the steps after the first (which pays one-off costs)
    predicted                       the formula (p − 1)/(v·m + p − 1): equal costs, free transfers (a
                                    zero-bubble schedule: its simulation at T_F = T_I = T_W, free transfers)
    measured_rate, simulated_rate,  the zero-bubble paper's bubble rate (`idle_rate`: the most idle time a
    formula_rate                    rank has between its first and last pass, over its work) — measured,
                                    simulated with the measured costs, and the formula at T_F = T_I = T_W
    simulated_with_measured_costs   the simulator running the schedule with this run's mean compute time per
                                    (stage, F or B) and its median transfer time — nothing else measured:
                                    no idle gap, no rank entering late, every wait decided by the simulator
    split                           the measured bubble (mean over the same steps) as a sum of terms, each
                                    what one more measured cost adds to the simulation (Qi et al.'s zero-bubble
                                    paper reasons the same way: the bubble is what the costs leave idle):
        formula                         (p − 1)/(v·m + p − 1), or the zero-bubble one as above
        uneven_stage_costs              simulated with the compute costs, free transfers, − formula (under
                                        NCCL's rule it also holds the stream ordering, docs/formulas.md)
        transfers                       + the measured transfer time on every boundary
        host_gaps                       + each rank's mean gap between compute actions that was not a wait
                                        (posting transfers, Python): idle time the rank caused itself
        entry_skew                      + each rank's measured entry into the step
        unexplained                     the measured bubble − all of the above (a rank descheduled, costs
                                        that vary from microbatch to microbatch)

No torch.
"""

from __future__ import annotations

import statistics
from typing import Any

from workbench.predict import formulas
from workbench.schedules.build import Action, Schedule, simulate
from workbench.schedules.simulator import idle_rate
from workbench.trace.recorder import LANES

Intervals = list[tuple[float, float]]
#: the split's terms, in the order each is added (their sum is the measured bubble)
TERMS = ("formula", "uneven_stage_costs", "transfers", "host_gaps", "entry_skew", "unexplained")


def idle_fraction(per_rank: list[Intervals]) -> float:
    """1 − busy / window, averaged over ranks; the window runs from the first busy moment of any rank to
    the last."""
    start = min(a for iv in per_rank for a, _ in iv)
    end = max(b for iv in per_rank for _, b in iv)
    return statistics.mean(1 - sum(b - a for a, b in iv) / (end - start) for iv in per_rank)


def _compute_spans(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and e.get("cat") in ("forward", "backward")
        and e.get("tid") == LANES["compute"]
    ]


def _by_step(trace: dict[str, Any], spans: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for e in spans:
        out.setdefault(e["args"].get("step", 0), []).append(e)
    return {k: sorted(v, key=lambda e: e["ts"]) for k, v in out.items()}


def pipelines(traces: list[dict[str, Any]], p: int) -> list[dict[int, dict[str, Any]]]:
    """The traces of each pipeline (one per data- and tensor-parallel coordinate), by pipeline rank."""
    replicas: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for t in traces:
        w = t["workbench"]
        replicas.setdefault((w["dp"], w["tp"]), {})[w["pp"]] = t
    return [r for r in replicas.values() if sorted(r) == list(range(p))]


def step_inputs(sched: Schedule, replica: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per complete step of one pipeline: each rank's compute spans, the mean compute time per (stage,
    kind), each rank's mean gap between compute actions less its waits, and when each rank entered."""
    compute = {r: _by_step(t, _compute_spans(t)) for r, t in replica.items()}
    entered = {
        r: _by_step(
            t,
            [
                e
                for e in t["traceEvents"]
                if e.get("ph") == "X" and e.get("tid") == LANES["schedule"]
            ],
        )
        for r, t in replica.items()
    }
    waits = {
        r: _by_step(
            t,
            [
                e
                for e in t["traceEvents"]
                if e.get("ph") == "X" and e.get("tid") == LANES["wait"] and e.get("cat") == "wait"
            ],
        )
        for r, t in replica.items()
    }
    out = {}
    for step in sorted(compute[0]):
        spans = {r: compute[r].get(step, []) for r in replica}
        if any(
            len(spans[r]) != sum(isinstance(a, Action) for a in sched.program(r)) for r in replica
        ) or any(step not in entered[r] for r in replica):
            continue  # an interrupted step
        durations: dict[tuple[int, str], list[float]] = {}
        for e in (e for r in replica for e in spans[r]):
            # F, B, I or W
            kind = e["args"].get("action") or ("F" if e["cat"] == "forward" else "B")
            durations.setdefault((e["args"].get("stage", 0), kind), []).append(e["dur"])
        first = min(entered[r][step][0]["ts"] for r in replica)
        out[step] = {
            "spans": spans,
            "cost": {k: statistics.mean(v) for k, v in durations.items()},
            "gap": {r: _mean_gap(spans[r], waits[r].get(step, [])) for r in replica},
            "start": [entered[r][step][0]["ts"] - first for r in range(sched.p)],
        }
    return out


def _mean_gap(spans: list[dict[str, Any]], waits: list[dict[str, Any]]) -> float:
    """The mean time from the end of a compute action to the start of the rank's next one, less the time
    it waited in between (for a peer: the simulator decides those waits)."""
    gaps = []
    for e, nxt in zip(spans, spans[1:], strict=False):
        end = e["ts"] + e["dur"]
        waited = sum(
            max(0.0, min(w["ts"] + w["dur"], nxt["ts"]) - max(w["ts"], end)) for w in waits
        )
        gaps.append(max(0.0, nxt["ts"] - end - waited))
    return statistics.mean(gaps) if gaps else 0.0


def action_costs(cost: dict[tuple[int, str], float], gap: dict[int, float]) -> Any:
    """The simulator's cost function from measured costs: each action (stage, kind) its mean compute time,
    plus its rank's host gap between actions (none where `gap` has no entry); transfers cost nothing here."""

    def f(r: int, item: Any) -> tuple[float, float]:
        if not isinstance(item, Action):
            return 0.0, 0.0
        busy = cost.get((item.stage, item.kind), 0.0)
        return busy + gap.get(r, 0.0), busy

    return f


def _levels(
    sched: Schedule, inputs: dict[str, Any], t_comm: float, rule: str
) -> list[tuple[float, float]]:
    """The simulated bubble, as (idle fraction, idle rate), with the measured costs added one at a time:
    compute, transfers, host gaps, entry skew."""
    cost, gap = inputs["cost"], inputs["gap"]

    def bubble_of(with_gaps: bool, t: float, start: list[float] | None) -> tuple[float, float]:
        timeline = simulate(
            sched,
            cost=action_costs(cost, gap if with_gaps else {}),
            t_comm=t,
            start=start,
            rule=rule,
        )
        spans = [[(b, e) for _, b, e in rank] for rank in timeline.spans]
        return idle_fraction(spans), idle_rate(spans)

    return [
        bubble_of(False, 0.0, None),
        bubble_of(False, t_comm, None),
        bubble_of(True, t_comm, None),
        bubble_of(True, t_comm, inputs["start"]),
    ]


def split_per_step(
    sched: Schedule, traces: list[dict[str, Any]], rule: str = "gloo"
) -> dict[int, dict[str, float]]:
    """Per step, the measured bubble and its terms (TERMS), each the mean over the pipelines."""
    formula = formulas.schedule_bubble_fraction(sched)
    per_step: dict[int, list[dict[str, float]]] = {}
    replicas = pipelines(traces, sched.p)
    for replica in replicas:
        transfer_us = transfer_time(list(replica.values()))
        for step, inputs in step_inputs(sched, replica).items():
            rated = _levels(sched, inputs, transfer_us.get(step, 0.0), rule)
            levels = [f for f, _ in rated]
            spans = [[(e["ts"], e["ts"] + e["dur"]) for e in inputs["spans"][r]] for r in replica]
            measured = idle_fraction(spans)
            chain = [formula, *levels, measured]
            terms = dict(
                zip(
                    TERMS,
                    [formula] + [b - a for a, b in zip(chain, chain[1:], strict=False)],
                    strict=True,
                )
            )
            per_step.setdefault(step, []).append(
                {
                    "measured": measured,
                    "simulated": levels[1],
                    **terms,
                    "measured_rate": idle_rate(spans),
                    "simulated_rate": rated[1][1],
                }
            )
    return {
        step: {k: statistics.mean(v[k] for v in values) for k in values[0]}
        for step, values in sorted(per_step.items())
        if len(values) == len(replicas)
    }


def transfer_time(traces: list[dict[str, Any]]) -> dict[int, float]:
    """Per step, what a transfer between pipeline ranks costs the rank that waits for it: the median, over
    the step's transfers, of the receiving wait's end less the later of the wait's start and the send's
    posting (a receiver that came late waited less than the transfer took; one that came early waited for
    the send to be posted, then for the transfer). Clamped at 0: ranks' clocks agree to a few hundred µs."""
    posted: dict[int, float] = {}
    arrived: dict[int, tuple[int, float, float]] = {}  # flow → (step, its wait's start and end)
    for t in traces:
        waits = sorted(
            (e["ts"], e["ts"] + e["dur"], e["args"].get("step", -1))
            for e in t["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") == "wait" and e.get("tid") == LANES["wait"]
        )
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


def bubble(config: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    sched = formulas.run_schedule(config)
    rule = "nccl" if config.get("backend") == "nccl" else "gloo"
    per_step = split_per_step(sched, traces, rule)
    kept = {k: v for k, v in per_step.items() if k > 0 or len(per_step) == 1}
    measured = [v["measured"] for v in kept.values()]
    simulated = [v["simulated"] for v in kept.values()]
    rates = {
        k: statistics.median(v[k] for v in kept.values()) if kept else None
        for k in ("measured_rate", "simulated_rate")
    }
    split = (
        {k: statistics.mean(v[k] for v in kept.values()) for k in ("measured", *TERMS)}
        if kept
        else None
    )
    return {
        "measured": statistics.median(measured) if measured else None,
        "measured_per_step": measured,
        "predicted": formulas.schedule_bubble_fraction(sched),
        "simulated_with_measured_costs": statistics.median(simulated) if simulated else None,
        "simulated_per_step": simulated,
        "split": split,
        "rule": rule,
        # the paper's bubble rate (idle between a rank's first and last pass ÷ its work; `idle_rate`):
        # measured, simulated with the measured costs, and the formula at T_F = T_I = T_W
        **rates,
        "formula_rate": _formula_rate(config, sched),
    }


def _formula_rate(config: dict[str, Any], sched: Schedule) -> float | None:
    try:
        return formulas.bubble_rate(config.get("schedule", "1f1b"), sched.p, sched.m, sched.v)
    except ValueError:  # a CSV schedule: its simulation at equal costs
        return simulate(sched, t_f=1.0, t_b=2.0, t_w=1.0).bubble_rate()
