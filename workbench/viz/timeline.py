"""Per-rank timeline: a Gantt chart with one row per (rank, lane), read from a Run's events.

Rows, top to bottom for each rank: `compute` (forward, backward, optimizer), `comm` (blocking
collectives and launches), `comm in flight` (asynchronous collectives from launch to completion —
the bars that overlap backward when bucketing works), `wait` (time blocked on a handle), `ring`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.run import Run
from workbench.viz.palette import span_color

#: `launch`: the host queueing an operation (on CUDA every operation; on gloo the asynchronous ones);
#: `offload`: ZeRO-Offload's copies between device and host
LANE_ORDER = [
    "compute",
    "torch ops",
    "launch",
    "comm",
    "comm in flight",
    "wait",
    "offload",
    "schedule",
    "ring",
]


def _rows(events: pd.DataFrame, nodes: list[str] | None = None) -> pd.DataFrame:
    """Each event's row: its rank and lane, and where the ranks ran on several nodes (`nodes`: each rank's,
    config.json's `hosts`), the rank's node as well."""
    ev = events.copy()
    ev["row_lane"] = ev.lane.where(ev.kind != "async", "comm in flight")
    ev["cat"] = span_kinds(ev)
    ev = ev[~((ev.cat == "step") & (ev.lane == "compute"))]  # the step span encloses everything
    ev["row"] = ev["rank"].map(lambda r: _rank_label(int(r), nodes)) + " · " + ev.row_lane
    return ev


def _rank_label(rank: int, nodes: list[str] | None) -> str:
    """'rank 2', or 'rank 2 (node 1)' where the ranks ran on several nodes (numbered in the order the ranks
    first name them: torchrun gives node 0 the first ranks)."""
    order = list(dict.fromkeys(nodes or []))
    if len(order) < 2 or rank >= len(nodes or []):
        return f"rank {rank}"
    return f"rank {rank} (node {order.index((nodes or [])[rank])})"


def timeline(
    run: Run,
    steps: list[int] | None = None,
    ranks: list[int] | None = None,
    title: str | None = None,
    torch_ops: bool = False,
) -> go.Figure:
    """Gantt of the given steps (default: the last two) on the given ranks (default: all). torch_ops: a
    `torch ops` row per rank from its torch.profiler trace (--profile-steps), placed on our clock."""
    ev = run.events
    if ev.empty:
        return go.Figure(layout={"title": "no events recorded"})
    all_steps = sorted(int(s) for s in ev.step.dropna().unique())
    steps = steps if steps is not None else all_steps[-2:]
    ev = _in_steps(ev, steps)
    if ranks is not None:
        ev = ev[ev["rank"].isin(ranks)]
    if torch_ops:
        ev = pd.concat([ev, _torch_ops(run, ev)], ignore_index=True)
    nodes = run.config.get("hosts")
    ev = _rows(ev, nodes)
    t0 = ev.start_us.min()
    order = [
        f"{_rank_label(int(r), nodes)} · {lane}"
        for r in sorted(ev["rank"].unique())
        for lane in LANE_ORDER
        if f"{_rank_label(int(r), nodes)} · {lane}" in set(ev.row)
    ]
    height = max(300, 28 * len(order) + 120)
    fig = go.Figure()
    for cat, group in ev.groupby("cat", sort=False):
        fig.add_trace(
            go.Bar(
                y=group.row,
                x=group.dur_us / 1e3,
                base=(group.start_us - t0) / 1e3,
                orientation="h",
                name=cat,
                marker_color=span_color(str(cat)),
                marker_line_width=0.5,
                marker_line_color="white",
                customdata=_hover(group),
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="overlay",
        title=title
        or f"timeline — {run.config.get('name') or run.path.rsplit('/', 1)[-1]}, steps {steps}",
        xaxis_title="time (ms)",
        height=height + 60,
        yaxis={
            "categoryorder": "array",
            "categoryarray": list(reversed(order)),
            "title": "rank · lane",
        },
        # below the chart, in rows: at the side a long legend scrolled and hid its last kinds
        legend={
            "title": {"text": "span"},
            "orientation": "h",
            "yanchor": "top",
            "xanchor": "left",
            "x": 0,
            "y": -60 / height,
        },
        margin={"l": 150, "b": 110},
    )
    return fig


def span_kinds(ev: pd.DataFrame) -> pd.Series:
    """Each event's kind as the charts draw it: an asynchronous operation's bar is its transfer in flight
    ('collective in flight'), its own colour, apart from blocking collectives and from `wait` (the host
    blocked: on the transfer, or on a slower peer)."""
    return ev.cat.where(ev.kind != "async", ev.cat + " in flight")


def _in_steps(ev: pd.DataFrame, steps: list[int]) -> pd.DataFrame:
    """The events of the given steps, and those carrying no step number (recomputation, some
    checkpoint and schedule spans) that lie inside those steps' window on their rank."""
    tagged = ev[ev.step.isin(steps)]
    window = tagged.groupby("rank").agg(lo=("start_us", "min"), hi=("end_us", "max"))
    loose = ev[ev.step.isna()].join(window, on="rank")
    loose = loose[(loose.start_us >= loose.lo) & (loose.end_us <= loose.hi)].drop(
        columns=["lo", "hi"]
    )
    return pd.concat([tagged, loose], ignore_index=True) if len(loose) else tagged


def _torch_ops(run: Run, ev: pd.DataFrame) -> pd.DataFrame:
    """Each shown rank's profiled ops inside the shown window, as events of lane `torch ops`."""
    from workbench.trace.torch_ops import load_ops

    rows = []
    lo, hi, shown = ev.start_us.min(), ev.end_us.max(), set(ev["rank"])
    for t in run.traces:
        info = t["workbench"]
        if info["rank"] not in shown:
            continue
        for op in load_ops(run.path, info):
            if lo <= op["start_us"] <= hi:
                rows.append(
                    {
                        "rank": info["rank"],
                        "lane": "torch ops",
                        "kind": "span",
                        "cat": "torch op",
                        "name": op["name"],
                        "start_us": op["start_us"],
                        "dur_us": op["dur_us"],
                        "end_us": op["start_us"] + op["dur_us"],
                    }
                )
    return pd.DataFrame(rows)


def _hover(group: pd.DataFrame) -> list[str]:
    out = []
    for _, e in group.iterrows():
        parts = [f"<b>{e['name']}</b>", f"{e.dur_us / 1e3:.3f} ms from {e.start_us / 1e3:.3f} ms"]
        for key in (
            "step",
            "microbatch",
            "op",
            "group",
            "seq",
            "bytes",
            "peer",
            "phase",
            "busbw_GBps",
        ):
            value: Any = e.get(key)
            if value is not None and not (isinstance(value, float) and pd.isna(value)):
                parts.append(f"{key}: {value}")
        out.append("<br>".join(parts))
    return out


def overlap_table(run: Run) -> pd.DataFrame:
    """Per rank: compute, communication, the part of it hidden under compute, and idle time (s)."""
    cols = ["rank", "step_time_s", "compute_s", "comm_s", "overlap_s", "exposed_comm_s", "idle_s"]
    return pd.DataFrame(
        [{k: r[k] for k in cols} for r in run.summary.get("ranks", [])], columns=cols
    )
