"""DualPipe and DualPipeV measured: what a run's trace says about its bubble, its F&B pairs and its memory,
beside DeepSeek's published costs (the deepseek-ai/DualPipe README's table) and the schedules before it.

    measured_costs(run)      the mean time of one stage's F, B, I, W and of an F&B pair (ms), from the
                             trace's compute spans, over the steps after the first
    measured_idle(run)       the idle time per rank over a step (ms): the step's window, from the first
                             compute action of any rank to the last, less the rank's own compute time —
                             the most idle rank, median over the steps after the first
    deepseek_idle(...)       the README's bubble for 1F1B, ZB1P (our ZB-H1) and DualPipe(V), in the same units
    pairs(run)               each F&B pair as it ran: its F and its B, and the gap between them (one CPU
                             thread per rank runs the F, then the B: it waits between them when the B's
                             input, received lazily, has not arrived yet)
    held_at_peak(run)        per rank, the microbatch-stages whose activations it held when its measured
                             `activation` counter peaked: forwards begun before that moment less backwards
                             (B or I) ended before it
    planned_idle(run, cost)  the run's schedule simulated with its measured costs, free transfers: its idle
    bubble_table(runs)       the measured idle beside the README's formula and the simulation, with the
                             run's own costs
    memory_table(runs)       per rank: model states, activations and the W stash measured (the summary's
                             `peak_bytes`), and the microbatch-stages held at the peak beside PP + 1

Reads Runs (their events, traces and memory counters) only; no torch.
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from workbench.analysis.run import Run
from workbench.predict import formulas
from workbench.predict.formulas.zero_bubble import dualpipe_bubble
from workbench.schedules.actions import peak_in_flight
from workbench.schedules.simulator import Timeline, simulate
from workbench.viz.pipeline import SPAN_KIND, pair_numbers

#: the README's name for each of our schedules, and its pipeline stages PP at p ranks
LABELS = {
    "1f1b": "1F1B",
    "zbh1": "ZB-H1 (the README's ZB1P)",
    "zbv": "ZBV",
    "dualpipev": "DualPipeV",
    "dualpipe": "DualPipe",
}


def stages_pp(schedule: str, p: int) -> int:
    """PP, the README's number of pipeline stages, for a schedule on p ranks: the V's (ZBV, DualPipeV) 2p,
    DualPipe's p (each of its two pipelines has p stages), 1F1B's and ZB-H1's p."""
    return 2 * p if schedule in ("zbv", "dualpipev") else p


def deepseek_idle(
    schedule: str, p: int, *, f: float, b: float, w: float, fb: float | None = None
) -> float | None:
    """The deepseek-ai/DualPipe README's bubble, an idle time per rank over a step, with f, b, w one stage's
    forward, full backward and weight pass and fb an F&B pair's (f + b unless given):

        1F1B        (PP − 1)(F + B)
        ZB1P        (PP − 1)(F + B − 2W)      our ZB-H1
        DualPipe    (PP/2 − 1)(F&B + B − 3W)  DualPipeV the same, with PP = 2p

    None for a schedule the table does not list (ZBV)."""
    pp = stages_pp(schedule, p)
    if schedule == "1f1b":
        return (pp - 1) * (f + b)
    if schedule == "zbh1":
        return (pp - 1) * (f + b - 2 * w)
    if schedule in ("dualpipe", "dualpipev"):
        return dualpipe_bubble(pp, f=f, b=b, w=w, fb=fb)
    return None


def compute_spans(run: Run) -> pd.DataFrame:
    """The compute actions (F, B, I, W) of the steps after the first (all of a one-step run): rank, step,
    kind, stage, microbatch, start_us, end_us, dur_us and pair (−1 outside a pair)."""
    ev = run.events
    ev = ev[(ev.lane == "compute") & ev.name.isin(list(SPAN_KIND))].copy()
    if ev.step.max() > ev.step.min():
        ev = ev[ev.step > ev.step.min()]
    ev["kind"] = ev.name.map(SPAN_KIND)
    cols = ["rank", "step", "stage", "microbatch"]
    ev[cols] = ev[cols].astype(int)
    pair = pair_numbers(run)
    ev["pair"] = [
        pair.get((r, s, st, mb, k), -1)
        for r, s, st, mb, k in zip(
            ev["rank"], ev.step, ev.stage, ev.microbatch, ev.kind, strict=True
        )
    ]
    return ev[[*cols, "kind", "start_us", "end_us", "dur_us", "pair"]].reset_index(drop=True)


def pairs(run: Run) -> pd.DataFrame:
    """Each F&B pair of the steps after the first: rank, step, pair, its F's and its B's compute time and
    the gap from the F's end to the B's start (ms; negative would mean they overlapped)."""
    spans = compute_spans(run)
    spans = spans[spans.pair >= 0]
    rows = []
    for (rank, step, pair), g in spans.groupby(["rank", "step", "pair"]):
        f, b = g[g.kind == "F"].iloc[0], g[g.kind != "F"].iloc[0]
        rows.append(
            {
                "rank": rank,
                "step": step,
                "pair": pair,
                "F ms": f.dur_us / 1e3,
                "B ms": b.dur_us / 1e3,
                "B starts after F ends by (ms)": (b.start_us - f.end_us) / 1e3,
            }
        )
    return pd.DataFrame(rows)


def measured_costs(run: Run) -> dict[str, float]:
    """Mean compute time (ms) of one stage's F, full B, I and W, and of an F&B pair (its F's time plus its
    B's: a wait between them, for the B's input, is idle time, not the pair's), over every stage and the
    steps after the first; a kind the run never ran is absent."""
    spans = compute_spans(run)
    out = {str(k): float(g.dur_us.mean()) / 1e3 for k, g in spans.groupby("kind")}
    paired = spans[spans.pair >= 0].groupby(["rank", "step", "pair"]).dur_us.sum()
    if len(paired):
        out["F&B"] = paired.mean() / 1e3
    return out


def measured_idle(run: Run) -> float:
    """The idle time per rank over a step (ms): per step, the window from the first compute action of any
    rank to the last, less each rank's compute time, for the most idle rank; the median over the steps
    after the first."""
    spans = compute_spans(run)
    per_step = []
    for _, g in spans.groupby("step"):
        window = g.end_us.max() - g.start_us.min()
        per_step.append(max(window - r.dur_us.sum() for _, r in g.groupby("rank")))
    return statistics.median(per_step) / 1e3


def held_at_peak(run: Run, rank: int) -> int:
    """The microbatch-stages whose activations `rank` held when its `activation` counter peaked in the
    last step: the forwards begun before that moment less the backwards (B, I) ended before it."""
    spans = compute_spans(run)
    spans = spans[(spans["rank"] == rank) & (spans.step == spans.step.max())]
    mem = run.memory
    mem = mem[
        (mem["rank"] == rank)
        & (mem.ts_us >= spans.start_us.min())
        & (mem.ts_us <= spans.end_us.max())
    ]
    at = mem.ts_us.loc[mem.activation.idxmax()]  # the first sample at the peak
    begun = ((spans.kind == "F") & (spans.start_us < at)).sum()
    released = (spans.kind.isin(["B", "I"]) & (spans.end_us <= at)).sum()
    return int(begun - released)


def idle_per_rank(tl: Timeline) -> float:
    """The most idle time any rank has over a simulated step (from 0, when the first rank starts, to the
    end of the last action): the README's bubble, the same on every rank where nothing overlaps."""
    return max(tl.makespan - sum(e - b for _, b, e in rank) for rank in tl.spans)


def planned_idle(run: Run, cost: dict[str, float]) -> float:
    """The run's schedule simulated with its measured mean costs per stage (`measured_costs`, ms) under
    free transfers (gloo's rule, as the README's formula assumes): its idle per rank (ms). Unlike the
    formula, the simulation takes the costs as they are (W unequal to I, F unequal to W)."""
    s = formulas.run_schedule(run.config)
    per = s.model_part(0)[1] / s.p  # a stage's share of a rank's costs is 1/per
    b = cost.get("B", cost.get("I", 0.0) + cost.get("W", 0.0))
    fb = cost.get("F&B")
    tl = simulate(
        s,
        per * cost["F"],
        per * b,
        t_w=per * cost.get("W", b / 2),
        t_fb=None if fb is None else per * fb,
        rule="gloo",
    )
    return idle_per_rank(tl)


def _cell(x: float | None) -> Any:
    """A number (to 0.01), or a dash where none applies (a table shows no NaN)."""
    return "—" if x is None else round(float(x), 2)


def bubble_table(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run: its measured F, B, W and F&B (ms), the idle per rank measured beside the README's formula
    with those costs and the schedule simulated with them (`planned_idle`), and the summary's measured
    bubble fraction and rate."""
    rows = []
    for label, run in runs.items():
        c, cost = run.config, measured_costs(run)
        b = cost.get("B", cost.get("I", 0.0) + cost.get("W", 0.0))
        formula = deepseek_idle(
            c["schedule"], c["pp"], f=cost["F"], b=b, w=cost.get("W", 0.0), fb=cost.get("F&B")
        )
        bubble = run.summary["bubble_fraction"]
        rows.append(
            {
                "run": label,
                "PP stages": stages_pp(c["schedule"], c["pp"]),
                "F ms": cost["F"],
                "B ms": b,
                "W ms": _cell(cost.get("W")),
                "F&B ms": _cell(cost.get("F&B")),
                "idle per rank, measured (ms)": measured_idle(run),
                "README's formula, measured costs (ms)": _cell(formula),
                "simulated with the measured costs (ms)": planned_idle(run, cost),
                "bubble fraction, measured": bubble["measured"],
                "bubble rate, measured": bubble["measured_rate"],
            }
        )
    return pd.DataFrame(rows)


def memory_table(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run and rank: the measured parameters, model states (parameters, gradients, optimizer state),
    activations and W stash (MB, the summary's `peak_bytes`), and the microbatch-stages held at the
    activation peak — measured (`held_at_peak`), walked from the schedule (`peak_in_flight`), and the
    README's PP + 1 for DualPipe(V) (its PP for 1F1B and ZB1P, the most any rank holds)."""
    rows = []
    for label, run in runs.items():
        c = run.config
        walked = peak_in_flight(formulas.run_schedule(c))
        pp = stages_pp(c["schedule"], c["pp"])
        readme = pp + 1 if c["schedule"] in ("dualpipe", "dualpipev") else pp
        for r in run.summary["ranks"]:
            peak = r["peak_bytes"]
            rows.append(
                {
                    "run": label,
                    "rank": r["rank"],
                    "parameters MB": peak["parameter"] / 1e6,
                    "model states MB": sum(
                        peak[k] for k in ("parameter", "gradient", "optimizer_state")
                    )
                    / 1e6,
                    "activations MB": peak["activation"] / 1e6,
                    "W stash MB": peak.get("wgrad_stash", 0) / 1e6,
                    "micro-batch-stages held at the peak": held_at_peak(run, r["rank"]),
                    "schedule's walk": walked[r["rank"]],
                    "README": readme if c["schedule"] != "zbv" else "— (not in the table)",
                }
            )
    return pd.DataFrame(rows)
