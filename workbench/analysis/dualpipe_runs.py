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
    pairing(run)             per kind of pair, its F's and B's time beside the same stages' unpaired ones
    forwards_after(run)      per stage, a forward's mean time by what the rank ran just before it
    held_at_peak(run)        per rank, the microbatch-stages whose activations it held when its measured
                             `activation` counter peaked: forwards begun before that moment less backwards
                             (B or I) ended before it
    planned_idle(run, cost)  the run's schedule simulated with its measured costs, free transfers: its idle
    bubble_table(runs)       the measured idle beside the README's formula and the simulation, with the
                             run's own costs
    memory_table(runs)       per rank: model states, activations and the W stash measured (the summary's
                             `peak_bytes`), and the microbatch-stages held at the peak beside PP + 1, also
                             in rank shares (`rank_shares`)

Units: a micro-batch-stage is one microbatch's activations on one of the schedule's stages. A V's stage
(ZBV, DualPipeV: 2P stages on P ranks) is half a rank's share of the model; a 1F1B, ZB-H1 or DualPipe
stage (1/P of the model, or of one of DualPipe's two copies) a whole one. `rank_shares` counts in those
whole ones, 1/P of the model each, so that schedules compare.

Reads Runs (their events, traces and memory counters) only; no torch.
"""

from __future__ import annotations

import statistics
from typing import Any

import pandas as pd

from workbench.analysis.run import Run
from workbench.predict import formulas
from workbench.predict.formulas.zero_bubble import dualpipe_bubble
from workbench.schedules.actions import Schedule, peak_in_flight
from workbench.schedules.simulator import Timeline, simulate

#: the README's name for each of our schedules, and its pipeline stages PP at p ranks
LABELS = {
    "1f1b": "1F1B",
    "zbh1": "ZB-H1 (the README's ZB1P)",
    "zbv": "ZBV",
    "dualpipev": "DualPipeV",
    "dualpipe": "DualPipe",
}

#: the executor's compute span names → the action kinds
SPAN_KIND = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}


def pair_numbers(run: Run) -> dict[tuple[int, int, int, int, str], int]:
    """(rank, step, stage, microbatch, F/B/I/W) → the number of the F&B pair that action belonged to, from
    the compute spans' args (the executor writes `pair` there; the events table does not keep it)."""
    out = {}
    for trace in run.traces:
        rank = trace["distributedInfo"]["rank"]
        for e in trace["traceEvents"]:
            a = e.get("args", {})
            if e.get("ph") == "X" and e.get("name") in SPAN_KIND and a.get("pair") is not None:
                out[(rank, a["step"], a["stage"], a["microbatch"], SPAN_KIND[e["name"]])] = a[
                    "pair"
                ]
    return out


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


def _pair_label(f_stage: int, b_stage: int) -> str:
    return f"F of stage {f_stage}; B of stage {b_stage}"


def pairing(run: Run) -> pd.DataFrame:
    """Per kind of pair (rank, its F's stage, its B's stage), over the steps after the first: the pair's F
    and B (mean ms) beside the same stages' F and B outside a pair (I + W where the stage ran no unpaired
    B), and the pair's F + B over theirs — 1 where pairing changes nothing, below 1 where a pair is
    shorter than its parts would be alone (`—`: no unpaired action to compare with)."""
    spans = compute_spans(run)
    spans["ms"] = spans.dur_us / 1e3
    alone = spans[spans.pair < 0]

    def mean(stage: int, kind: str) -> float | None:
        x = alone[(alone.stage == stage) & (alone.kind == kind)].ms
        return float(x.mean()) if len(x) else None

    rows: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for _, g in spans[spans.pair >= 0].groupby(["rank", "step", "pair"]):
        f, b = g[g.kind == "F"].iloc[0], g[g.kind != "F"].iloc[0]
        rows.setdefault((int(f["rank"]), int(f.stage), int(b.stage)), []).append((f.ms, b.ms))
    out = []
    for (rank, fs, bs), times in sorted(rows.items()):
        f_alone = mean(fs, "F")
        b_alone = mean(bs, "B")
        i, w = mean(bs, "I"), mean(bs, "W")
        if b_alone is None and i is not None and w is not None:
            b_alone = i + w
        f_ms = statistics.mean(f for f, _ in times)
        b_ms = statistics.mean(b for _, b in times)
        ratio = None if f_alone is None or b_alone is None else (f_ms + b_ms) / (f_alone + b_alone)
        out.append(
            {
                "rank": rank,
                "pair": _pair_label(fs, bs),
                "pairs": len(times),
                "F ms, paired": f_ms,
                "F ms, unpaired": _cell(f_alone),
                "B ms, paired": b_ms,
                "B ms, unpaired (I + W where no B)": _cell(b_alone),
                "paired F + B ÷ unpaired": _cell(ratio),
            }
        )
    return pd.DataFrame(out)


def head_stages(run: Run) -> list[int]:
    """The stages that hold the model's last part (the head and the loss)."""
    s = formulas.run_schedule(run.config)
    last = s.model_part(0)[1] - 1
    return [st for st in range(s.stages) if s.model_part(st)[0] == last]


def forwards_after(run: Run) -> pd.DataFrame:
    """Per stage, over the steps after the first: a forward's mean time (ms) when it is the rank's first
    action of the step, when the rank's action just before it ran on the same stage, and on another
    stage (`—`: no such forward)."""
    spans = compute_spans(run).sort_values(["rank", "step", "start_us"])
    before = spans.groupby(["rank", "step"]).stage.shift(1)
    spans["after"] = [
        "first of the step" if b != b else "the same stage" if b == st else "another stage"
        for b, st in zip(before, spans.stage, strict=True)
    ]
    forwards = spans[spans.kind == "F"]
    heads = head_stages(run)
    rows = []
    for stage, g in forwards.groupby("stage"):
        row: dict[str, Any] = {"stage": int(stage), "holds the head": stage in heads}
        for after in ("first of the step", "the same stage", "another stage"):
            x = g[g.after == after].dur_us
            row[
                f"F ms after {after}" if after != "first of the step" else "F ms, first of the step"
            ] = _cell(x.mean() / 1e3 if len(x) else None)
        rows.append(row)
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
    return tl.idle_per_rank()


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


#: bubble_table's columns that the notebook reads
MEASURED_IDLE = "idle per rank, measured (ms)"
FORMULA_IDLE = "formula with the measured costs (ms)"
SIMULATED_IDLE = "simulated, one mean cost per kind (ms)"


def _formula_cell(schedule: str, p: int, cost: dict[str, float], b: float) -> Any:
    """The README's idle per rank with the measured costs; for ZBV, which the README does not list, the
    zero-bubble paper's rate 0 plus the start-up stagger it leaves out, (P − 1) stage forwards."""
    formula = deepseek_idle(schedule, p, f=cost["F"], b=b, w=cost.get("W", 0.0), fb=cost.get("F&B"))
    if formula is None and schedule == "zbv":
        return f"ZB paper: 0, + the stagger (P − 1)·F = {(p - 1) * cost['F']:.2f}"
    return _cell(formula)


def bubble_table(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run: its measured F, B, W and F&B (ms, one stage's: a V's stage is half a rank's share), the idle
    per rank measured (`measured_idle`) beside the formula with those costs and the schedule simulated
    with one mean cost per kind (`planned_idle`), and the summary's measured bubble fraction (idle share
    of the step, averaged over the ranks) and rate (the most idle rank's idle between its first and last
    action, over its work). B is I + W for a run that ran no B (named in the column)."""
    rows, split = [], []
    for label, run in runs.items():
        c, cost = run.config, measured_costs(run)
        if "B" not in cost:
            split.append(LABELS.get(c["schedule"], label))
        b = cost.get("B", cost.get("I", 0.0) + cost.get("W", 0.0))
        bubble = run.summary["bubble_fraction"]
        rows.append(
            {
                "run": label,
                "PP stages": stages_pp(c["schedule"], c["pp"]),
                "F ms (a stage's)": cost["F"],
                "B ms": b,
                "W ms": _cell(cost.get("W")),
                "F&B ms": _cell(cost.get("F&B")),
                MEASURED_IDLE: measured_idle(run),
                FORMULA_IDLE: _formula_cell(c["schedule"], c["pp"], cost, b),
                SIMULATED_IDLE: planned_idle(run, cost),
                "bubble fraction, measured": bubble["measured"],
                "bubble rate, measured": bubble["measured_rate"],
            }
        )
    table = pd.DataFrame(rows)
    if split:
        table = table.rename(columns={"B ms": f"B ms (I + W for {', '.join(split)})"})
    return table


def rank_shares(s: Schedule, stages: float) -> float:
    """`stages` micro-batch-stages of schedule `s` counted in rank shares (1/P of the model each): a V's
    stage is half of one, a 1F1B, ZB-H1 or DualPipe stage one (see the module's Units)."""
    return stages / (s.model_part(0)[1] / s.p)


def memory_table(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run and rank: the measured parameters, model states (parameters, gradients, optimizer state),
    activations and W stash (MB, the summary's `peak_bytes`), and the microbatch-stages held at the
    activation peak — measured (`held_at_peak`), in rank shares (`rank_shares`), walked from the schedule
    (`peak_in_flight`), and the README's PP + 1 for DualPipe(V) (its PP for 1F1B and ZB1P: the first
    rank's, the most any rank holds)."""
    rows = []
    for label, run in runs.items():
        c = run.config
        schedule = formulas.run_schedule(c)
        walked = peak_in_flight(schedule)
        pp = stages_pp(c["schedule"], c["pp"])
        readme = pp + 1 if c["schedule"] in ("dualpipe", "dualpipev") else pp
        for r in run.summary["ranks"]:
            peak, held = r["peak_bytes"], held_at_peak(run, r["rank"])
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
                    "micro-batch-stages held at the peak": held,
                    "= rank shares": rank_shares(schedule, held),
                    "schedule's walk": walked[r["rank"]],
                    "README": readme if c["schedule"] != "zbv" else "— (not in the table)",
                }
            )
    return pd.DataFrame(rows)
