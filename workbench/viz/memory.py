"""Memory per rank by category: the measured peak beside the formula's prediction, and over time."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.run import Run
from workbench.trace.recorder import MEMORY_CATEGORIES

#: one colour per memory category, in the categories' order
CATEGORY_COLORS = dict(zip(MEMORY_CATEGORIES, ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2",
                                               "#BAB0AC"), strict=True))


def memory_breakdown(run: Run, title: str | None = None) -> go.Figure:
    """Per rank, two stacked bars: the peak of each category measured, and the formulas' prediction."""
    ranks = run.summary.get("ranks", [])
    fig = go.Figure()
    for cat, color in CATEGORY_COLORS.items():
        x0, x1, y = [], [], []
        for r in ranks:
            for kind, source in (("measured", r["peak_bytes"]), ("predicted", r["predicted_bytes"])):
                if cat in source or kind == "measured":
                    x0.append(f"rank {r['rank']}")
                    x1.append(kind)
                    y.append(source.get(cat, 0) / 1e6)
        if any(y):
            fig.add_trace(go.Bar(x=[x0, x1], y=y, name=cat, marker_color=color,
                                 hovertemplate=f"{cat}: %{{y:.4f}} MB<extra></extra>"))
    fig.update_layout(barmode="stack", yaxis_title="MB (peak per category)",
                      title=title or "memory per rank — measured peak beside predicted")
    return fig


def memory_over_time(run: Run, rank: int = 0, steps: int = 2) -> go.Figure:
    """Stacked counters of one rank over its first `steps` steps (values held between samples)."""
    mem = run.memory
    mem = mem[mem["rank"] == rank].sort_values("ts_us")
    ev = run.events
    step_spans = ev[(ev["rank"] == rank) & (ev.cat == "step")].sort_values("start_us")
    if len(step_spans) > steps:
        mem = mem[mem.ts_us <= step_spans.end_us.iloc[steps - 1]]
    fig = go.Figure()
    for cat, color in CATEGORY_COLORS.items():
        if cat in mem and mem[cat].any():
            fig.add_trace(go.Scatter(x=mem.ts_us / 1e3, y=mem[cat] / 1e6, name=cat, stackgroup="one",
                                     line={"shape": "hv", "color": color}))
    fig.update_layout(title=f"memory over time — rank {rank}", xaxis_title="time (ms)", yaxis_title="MB")
    return fig
