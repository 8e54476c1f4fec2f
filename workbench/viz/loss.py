"""Loss curves of several runs, and how far each is from a baseline (the correctness oracle)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.run import Run


def loss_curves(runs: dict[str, Run], baseline: str | None = None) -> go.Figure:
    """Left: loss per step of each run. Right (with a baseline): |loss − baseline loss| per step."""
    cols = 2 if baseline else 1
    titles = ["loss"] + ([f"|loss − {baseline}|"] if baseline else [])
    fig = make_subplots(rows=1, cols=cols, subplot_titles=titles)
    base = runs[baseline].metrics.set_index("step").loss if baseline else None
    for name, run in runs.items():
        m = run.metrics
        fig.add_trace(go.Scatter(x=m.step, y=m.loss, name=name, mode="lines+markers", legendgroup=name), 1, 1)
        if base is not None and name != baseline:
            diff = (m.set_index("step").loss - base).abs()
            fig.add_trace(go.Scatter(x=diff.index, y=diff.values, name=name, mode="lines+markers",
                                     legendgroup=name, showlegend=False), 1, 2)
    if baseline:
        fig.update_yaxes(type="log", exponentformat="e", row=1, col=2)
    fig.update_layout(xaxis_title="step", height=380)
    return fig


def compare_losses(runs: dict[str, Run], baseline: str) -> pd.DataFrame:
    """One row per run: world size, final loss, largest per-step |Δloss| against the baseline."""
    base = runs[baseline].metrics.set_index("step").loss
    rows = []
    for name, run in runs.items():
        m = run.metrics.set_index("step")
        rows.append({"run": name, "world_size": run.config.get("world_size"), "final_loss": m.loss.iloc[-1],
                     "max_abs_diff": float((m.loss - base).abs().max()),
                     "median_step_ms": 1e3 * float(m.step_time_s.median())})
    return pd.DataFrame(rows)
