"""Loss curves of several runs, and how far each is from a baseline (the correctness oracle)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.run import Run
from workbench.viz.palette import SERIES_COLORS

SYMBOLS = ["circle", "square", "diamond", "triangle-up", "cross", "x", "star", "hexagon"]


def loss_curves(runs: dict[str, Run], baseline: str | None = None) -> go.Figure:
    """Left: loss per step of each run, the baseline drawn wide underneath (runs that equal it would
    otherwise hide it). Right (with a baseline): |loss − baseline loss| per step on a log axis; a step where
    the two are bit-identical (difference 0) has no log value: it is left out and counted in the title.
    A run with a validation loss (--eval-every) has it dashed beside its training loss."""
    cols = 2 if baseline else 1
    base = runs[baseline].metrics.set_index("step").loss if baseline else None
    diffs = {
        name: (run.metrics.set_index("step").loss - base).abs()
        for name, run in runs.items()
        if base is not None and name != baseline
    }
    zeros = sum(int((d == 0).sum()) for d in diffs.values())
    titles = ["loss per step"] + (
        [
            f"|loss − {baseline}|"
            + (f" ({zeros} steps equal to the bit: 0, not drawn)" if zeros else "")
        ]
        if baseline
        else []
    )
    fig = make_subplots(rows=1, cols=cols, subplot_titles=titles, horizontal_spacing=0.12)
    others = [n for n in runs if n != baseline]
    # one colour per run, the same for its curve and its |Δ| dots; each run its own marker, larger to
    # smaller, so that equal differences do not hide each other
    color = {n: SERIES_COLORS[i % len(SERIES_COLORS)] for i, n in enumerate(others)}
    symbol = {n: SYMBOLS[i % len(SYMBOLS)] for i, n in enumerate(others)}
    size = {n: 13 - 8 * i / max(1, len(others) - 1) for i, n in enumerate(others)}
    # the baseline first: underneath
    for name, run in sorted(runs.items(), key=lambda kv: kv[0] != baseline):
        m = run.metrics
        wide = (
            {"width": 7, "color": "rgba(120,120,120,0.45)"}
            if name == baseline
            else {"width": 2, "color": color[name]}
        )
        fig.add_trace(
            go.Scatter(
                x=m.step,
                y=m.loss,
                name=name,
                mode="lines" if name == baseline else "lines+markers",
                line=wide,
                marker={"color": wide["color"], "symbol": symbol.get(name, "circle")},
                legendgroup=name,
            ),
            1,
            1,
        )
        if "val_loss" in m and m.val_loss.notna().any():  # the held-out loss where it was computed
            v = m[m.val_loss.notna()]
            held = SERIES_COLORS[(len(runs) + list(runs).index(name)) % len(SERIES_COLORS)]
            # a legend entry, one colour
            fig.add_trace(
                go.Scatter(
                    x=v.step,
                    y=v.val_loss,
                    name=f"{name} (held out)",
                    mode="lines+markers",
                    line={"dash": "dash", "color": held, "width": 3},
                    marker={
                        "color": held,
                        "symbol": "diamond",
                        "size": 10,
                        "line": {"width": 1, "color": "white"},
                    },
                    legendgroup=f"{name} (held out)",
                ),
                1,
                1,
            )
        if name in diffs:
            d = diffs[name]
            fig.add_trace(
                go.Scatter(
                    x=d.index,
                    y=d.where(d > 0).values,
                    name=name,
                    mode="markers",
                    marker={
                        "color": color[name],
                        "symbol": symbol[name],
                        "size": size[name],
                        "line": {"width": 1, "color": "white"},
                    },
                    legendgroup=name,
                    showlegend=False,
                ),
                1,
                2,
            )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="loss (nats per token)", row=1, col=1)
    if baseline:
        fig.update_yaxes(type="log", exponentformat="e", title_text="|Δ loss| (nats)", row=1, col=2)
    fig.update_layout(height=400, legend_title_text="run")
    return fig


def compare_losses(runs: dict[str, Run], baseline: str) -> pd.DataFrame:
    """One row per run: world size, final loss, largest per-step |Δloss| against the baseline."""
    base = runs[baseline].metrics.set_index("step").loss
    rows = []
    for name, run in runs.items():
        m = run.metrics.set_index("step")
        rows.append(
            {
                "run": name,
                "world_size": run.config.get("world_size"),
                "final_loss": m.loss.iloc[-1],
                "max_abs_diff": float((m.loss - base).abs().max()),
                "median_step_ms": 1e3 * float(m.step_time_s.median()),
            }
        )
    return pd.DataFrame(rows)
