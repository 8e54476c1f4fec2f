"""Memory per rank by category: the measured peak beside the formula's prediction, and over time."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.analysis.run import Run
from workbench.viz.palette import MEMORY_COLORS as CATEGORY_COLORS


def memory_breakdown(run: Run, title: str | None = None) -> go.Figure:
    """Per rank, two stacked bars: the peak of each category measured, and the formulas' prediction."""
    ranks = run.summary.get("ranks", [])
    # many ranks: short labels, kept horizontal (rotated ones took a third of the chart)
    kinds = ("meas.", "pred.") if len(ranks) > 4 else ("measured", "predicted")
    fig = go.Figure()
    for cat, color in CATEGORY_COLORS.items():
        x0, x1, y = [], [], []
        for r in ranks:
            for kind, source in ((kinds[0], r["peak_bytes"]), (kinds[1], r["predicted_bytes"])):
                if cat in source or kind == kinds[0]:
                    x0.append(f"rank {r['rank']}")
                    x1.append(kind)
                    y.append(source.get(cat, 0) / 1e6)
        if any(y):
            fig.add_trace(
                go.Bar(
                    x=[x0, x1],
                    y=y,
                    name=cat,
                    marker_color=color,
                    hovertemplate=f"{cat}: %{{y:.4f}} MB<extra></extra>",
                )
            )
    totals = [
        (f"rank {r['rank']}", kinds[0], r["peak_total_bytes"] / 1e6)
        for r in ranks
        if "peak_total_bytes" in r
    ]
    if totals:  # the categories peak at different moments: what the rank pays at once is lower than the stack
        fig.add_trace(
            go.Scatter(
                x=[[t[0] for t in totals], [t[1] for t in totals]],
                y=[t[2] for t in totals],
                mode="markers",
                name="simultaneous total (measured)",
                marker={
                    "symbol": "line-ew-open",
                    "size": 40,
                    "color": "black",
                    "line": {"width": 3},
                },
                hovertemplate="all categories at once: %{y:.4f} MB<extra></extra>",
            )
        )
    alloc = [
        (f"rank {r['rank']}", kinds[0], r["allocator_peak_bytes"]["allocated"] / 1e6)
        for r in ranks
        if "allocator_peak_bytes" in r
    ]
    if alloc:
        fig.add_trace(
            go.Scatter(
                x=[[a[0] for a in alloc], [a[1] for a in alloc]],
                y=[a[2] for a in alloc],
                mode="markers",
                name="allocator peak (measured)",
                marker={"symbol": "diamond", "size": 10, "color": "black"},
                hovertemplate="allocator: %{y:.4f} MB<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        yaxis_title="MB (peak per category)",
        xaxis_tickangle=0,
        title=title or "memory per rank — measured peak beside predicted",
    )
    return fig


def memory_over_time(
    run: Run, rank: int = 0, steps: int = 2, first: int | None = None
) -> go.Figure:
    """Stacked counters of one rank over `steps` steps from step `first` (default: the first after the
    run's warm-up steps, `warmup_steps_excluded`; values held between samples); where the
    allocator was read: on CPU the bytes the communication backend's own threads allocated (measured by
    the profile, not booked), what it held beyond those and the categories as an `unattributed` band, and
    its line; with the CPU's profile, its true peak between the snapshots as a diamond."""
    mem = run.memory
    mem = mem[mem["rank"] == rank].sort_values("ts_us")
    ev = run.events
    step_spans = ev[(ev["rank"] == rank) & (ev.cat == "step")].sort_values("start_us")
    first = int(run.config.get("warmup_steps_excluded", 0)) if first is None else first
    first = min(first, max(len(step_spans) - 1, 0))
    window = (float("-inf"), float("inf"))
    if len(step_spans):
        window = (
            step_spans.start_us.iloc[first],
            step_spans.end_us.iloc[min(first + steps, len(step_spans)) - 1],
        )
        mem = mem[(mem.ts_us >= window[0]) & (mem.ts_us <= window[1])]
    fig = go.Figure()
    for cat, color in CATEGORY_COLORS.items():
        if cat in mem and mem[cat].any():
            fig.add_trace(
                go.Scatter(
                    x=mem.ts_us / 1e3,
                    y=mem[cat] / 1e6,
                    name=cat,
                    stackgroup="one",
                    line={"shape": "hv", "color": color},
                )
            )
    alloc = run.allocator
    alloc = (
        alloc[(alloc["rank"] == rank) & alloc.ts_us.isin(mem.ts_us)] if not alloc.empty else alloc
    )
    if not alloc.empty:
        merged = alloc.merge(mem, on=["rank", "ts_us"]).sort_values("ts_us")
        counted = merged[[c for c in CATEGORY_COLORS if c in merged]].sum(axis=1)
        # CPU profile: gloo's own buffers
        if "backend_threads" in merged and merged.backend_threads.any():
            counted = counted + merged.backend_threads
            fig.add_trace(
                go.Scatter(
                    x=merged.ts_us / 1e3,
                    y=merged.backend_threads / 1e6,
                    name="backend threads (measured)",
                    stackgroup="one",
                    line={"shape": "hv", "color": "#8c564b"},
                    fillpattern={"shape": "."},
                )
            )
        fig.add_trace(
            go.Scatter(
                x=merged.ts_us / 1e3,
                y=(merged.allocated - counted).clip(lower=0) / 1e6,
                name="unattributed",
                stackgroup="one",
                line={"shape": "hv", "color": "#222222"},
                fillpattern={"shape": "/"},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=merged.ts_us / 1e3,
                y=merged.allocated / 1e6,
                name="allocator (measured)",
                mode="lines",
                line={"shape": "hv", "color": "black", "dash": "dot"},
            )
        )
    peaks = run.allocator_peak
    # CPU profile: the most the allocator held at any moment, between two snapshots
    if not peaks.empty:
        peaks = peaks[
            (peaks["rank"] == rank) & (peaks.ts_us >= window[0]) & (peaks.ts_us <= window[1])
        ]
        if not peaks.empty:
            fig.add_trace(
                go.Scatter(
                    x=peaks.ts_us / 1e3,
                    y=peaks.allocated / 1e6,
                    mode="markers",
                    name="allocator's true peak (measured)",
                    marker={"symbol": "diamond", "size": 11, "color": "black"},
                )
            )
    note = f" (steps before {first} left out: warm-up)" if first else ""
    fig.update_layout(
        title=f"memory over time — rank {rank}, {steps} step(s) from step {first}{note}",
        xaxis_title="time (ms)",
        yaxis_title="MB",
    )
    return fig
