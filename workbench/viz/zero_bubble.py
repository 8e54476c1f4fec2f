"""Zero-bubble charts: where each W went, what deferring it costs in memory, the schedules side by side,
and torch's own picture of a schedule.

    w_deferral(schedule)        the simulated timeline at T_F = T_I = T_W, each W joined to its I: the gap
                                is how far the schedule pushed the weight gradient to fill a bubble
    stash_over_time(runs)       measured: activations and the weight-gradient stash of one rank through
                                one step, per run (the memory counter of the trace)
    side_by_side(runs)          the formula (the schedule simulated at T_F = T_I = T_W) beside measured, per
                                schedule: bubble, peak in-flight activations, peak stash
    torch_grid(schedule)        the schedule as torch's visualizer spaces it (torch.distributed.pipelining.
                                _schedule_visualizer.add_schedule_op_spacing, given our CSV's actions), each
                                rank's row holding its own actions (`torch_rows` says why that takes padding)
"""

from __future__ import annotations

import contextlib
import io

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.run import Run
from workbench.predict import formulas
from workbench.schedules.actions import COMPUTE, Schedule, peak_in_flight, peak_pending_w
from workbench.schedules.simulator import simulate
from workbench.viz.palette import SERIES_COLORS
from workbench.viz.pipeline import _bars


def w_deferral(s: Schedule, t_w: float = 1.0) -> go.Figure:
    """The schedule simulated at T_F = T_I = 1 and T_W = t_w, with a line from each I to its W: the W that
    moved furthest filled the cool-down's bubble."""
    tl = simulate(s, t_f=1.0, t_b=1.0 + t_w, t_w=t_w)
    fig = go.Figure()
    _bars(
        fig,
        [
            (r, a.kind, a.stage, a.microbatch, b, e)
            for r, spans in enumerate(tl.spans)
            for a, b, e in spans
        ],
        legend=False,
    )
    ends: dict[tuple[int, int], tuple[int, float]] = {}
    gaps = []
    for r, spans in enumerate(tl.spans):
        for a, b, e in spans:
            if a.kind == "I":
                ends[(a.stage, a.microbatch)] = (r, e)
            elif a.kind == "W":
                _, done = ends[(a.stage, a.microbatch)]
                gaps.append(b - done)
                fig.add_trace(
                    go.Scatter(
                        x=[done, b],
                        y=[f"rank {r}", f"rank {r}"],
                        mode="lines+markers",
                        line={"color": "black", "width": 1},
                        marker={"size": 4},
                        showlegend=False,
                        hovertemplate=f"{a}: {b - done:.1f} after its I<extra></extra>",
                    )
                )
    fig.update_layout(
        barmode="overlay",
        height=160 + 45 * s.p,
        uniformtext={"minsize": 8, "mode": "hide"},
        yaxis={"autorange": "reversed"},
        xaxis_title="time (one forward = 1)",
        title=f"{s.name}, p={s.p} m={s.m}: each W joined to its I — deferred by "
        f"{sum(gaps) / max(len(gaps), 1):.1f} on average, at most {max(gaps, default=0):.0f} "
        f"(B: I and W adjacent); bubble rate {tl.bubble_rate():.3f}",
    )
    return fig


def stash_over_time(runs: dict[str, Run], rank: int = 0, step: int | None = None) -> go.Figure:
    """One rank's measured `activation` and `wgrad_stash` bytes through one step (default: the last), one
    pair of lines per run: the stash is what deferring W costs, on top of what the activations leave."""
    fig = go.Figure()
    for i, (label, run) in enumerate(runs.items()):
        ev = run.events
        st = int(ev.step.max()) if step is None else step
        spans = ev[(ev["rank"] == rank) & (ev.step == st) & (ev.lane == "compute")]
        mem = run.memory
        mem = mem[
            (mem["rank"] == rank)
            & (mem.ts_us >= spans.start_us.min())
            & (mem.ts_us <= spans.end_us.max())
        ]
        t = (mem.ts_us - spans.start_us.min()) / 1e3
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        fig.add_trace(
            go.Scatter(
                x=t,
                y=mem.activation / 1e6,
                mode="lines",
                line={"color": color, "shape": "hv"},
                name=f"{label}: activation",
            )
        )
        if mem.get("wgrad_stash", pd.Series(dtype=float)).any():
            fig.add_trace(
                go.Scatter(
                    x=t,
                    y=mem.wgrad_stash / 1e6,
                    mode="lines",
                    line={"color": color, "dash": "dot", "shape": "hv"},
                    name=f"{label}: W stash",
                )
            )
    fig.update_layout(
        xaxis_title=f"ms into the step (rank {rank})",
        yaxis_title="MB (measured)",
        title="what deferring W costs: activations (solid) and the weight-gradient stash (dotted)",
        legend={"orientation": "h", "y": -0.25},
        height=380,
    )
    return fig


def side_by_side(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run: its schedule's formula (simulated at T_F = T_I = T_W: the paper's bubble rate and fraction,
    peak in-flight activations and stash on rank 0) beside what it measured (bubble fraction, peak
    activation and stash bytes on rank 0). In-flight activations in micro-batch-stages (a V's or an
    interleaved chunk is a stage) and in rank shares (1/p of the model each)."""
    rows = []
    for label, run in runs.items():
        c = run.config
        s = formulas.run_schedule(c)
        tl = simulate(s, t_f=1.0, t_b=2.0, t_w=1.0)
        peak = run.summary["ranks"][0]["peak_bytes"]
        held = peak_in_flight(s)[0]
        rows.append(
            {
                "run": label,
                "formula: bubble rate": tl.bubble_rate(),
                "formula: bubble fraction": tl.bubble_fraction(),
                "measured bubble fraction": run.summary["bubble_fraction"]["measured"],
                "in-flight activations, rank 0 (micro-batch-stages)": held,
                "= rank shares": held / (s.model_part(0)[1] / s.p),
                "W stashes (rank 0)": peak_pending_w(s)[0],
                "activation MB measured": peak["activation"] / 1e6,
                "W stash MB measured": peak.get("wgrad_stash", 0) / 1e6,
            }
        )
    return pd.DataFrame(rows)


def torch_rows(s: Schedule, *, pad: bool = True) -> list[list[str]]:
    """Each rank's compute actions as torch's `add_schedule_op_spacing` spaces them ('' where the rank
    waits; trailing waits dropped), its prints silenced.

    torch 2.13's function drops a rank's queue once it is empty (`rank_ops = [q for q in rank_ops if q]`)
    and goes on numbering the queues left from 0: after rank 0 finishes, rank 1's actions land in rank 0's
    row, timed against rank 0's clock. `pad` (the default) gives every rank enough empty steps after its
    last action that no queue empties before all the actions are placed; pad=False shows torch's own."""
    from torch.distributed.pipelining._schedule_visualizer import add_schedule_op_spacing
    from torch.distributed.pipelining.schedules import _Action

    actions: list[list[_Action | None]] = [
        [_Action.from_str(str(a)) for a in rank if a.kind in COMPUTE] for rank in s.actions
    ]
    if pad:  # more empty steps than the whole schedule could take, each action 3 steps at most
        longest = 3 * sum(len(rank) for rank in actions)
        actions = [rank + [None] * longest for rank in actions]
    with contextlib.redirect_stdout(io.StringIO()):
        spaced = add_schedule_op_spacing(actions)
    rows = [["" if a is None else str(a) for a in rank] for rank in spaced]
    for row in rows:
        while row and not row[-1]:
            row.pop()
    return rows


def torch_grid(s: Schedule) -> pd.DataFrame:
    """The schedule's compute actions as torch's visualizer spaces them (one column per time step, an
    empty cell where the rank waits), each rank's row its own (`torch_rows`, padded)."""
    rows = torch_rows(s)
    width = max(len(r) for r in rows)
    return pd.DataFrame(
        [r + [""] * (width - len(r)) for r in rows],
        index=[f"rank {r}" for r in range(len(rows))],
    )
