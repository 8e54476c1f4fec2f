"""The checkpoint-interval exercise's chart: on the left the time lost against the interval at one setting
(predict/formulas/faults.checkpoint_overhead: modelled), the learner's interval and the least marked; on the right
the measured side — each checkpoint the real run saved, its slowest rank's time by the clock, the first (which
also imports torch.distributed.checkpoint) set apart, and δ, the median of the others, that the left uses."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from workbench.predict.formulas.faults import checkpoint_overhead

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from workbench.exercises.checkpoint_interval import Found

YOURS, LEAST, CURVE, SAVE, SET_APART = "#E45756", "#54A24B", "#4C78A8", "#FF9DA6", "#BAB0AC"


def interval_chart(found: Found, *, per_save_s: list[float]) -> go.Figure:
    """Two panels: the waste curve with yours and the least, and the measured saves."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = found.setting
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.68, 0.32],
        horizontal_spacing=0.1,
        subplot_titles=(
            f"time lost (modelled) at δ = {1e3 * s.checkpoint_s:.1f} ms,<br>{s.nodes} nodes × "
            f"{s.failures_per_node_day:g} failures a day: M = {s.mtbf_s:.0f} s",
            "the run's checkpoint saves (measured)",
        ),
    )
    lo = min(found.yours_s, found.best_s) / 4
    hi = max(found.yours_s, found.best_s) * 4
    taus = [lo * (hi / lo) ** (i / 199) for i in range(200)]
    lost = [100 * checkpoint_overhead(t, s.checkpoint_s, s.mtbf_s) for t in taus]
    top = min(max(lost), 4 * 100 * max(found.waste, found.least))
    fig.add_trace(
        go.Scatter(x=taus, y=lost, name="δ/τ + τ/(2M) (modelled)", line={"color": CURVE}),
        row=1,
        col=1,
    )
    marks = (
        ("the least", found.best_s, 100 * found.least, LEAST),
        ("yours", found.yours_s, 100 * found.waste, YOURS),
    )
    for name, tau, lost_at, colour in marks:
        fig.add_trace(
            go.Scatter(
                x=[tau, tau],
                y=[0, lost_at],
                mode="lines+markers",
                name=f"{name}: every {tau:.3g} s, {lost_at:.2f} % lost",
                line={"dash": "dash", "color": colour},
            ),
            row=1,
            col=1,
        )
    fig.update_xaxes(type="log", title_text="checkpoint interval τ (s, log)", row=1, col=1)
    fig.update_yaxes(title_text="time lost (%)", range=[0, 1.15 * top], row=1, col=1)
    steps = [f"save {k + 1}" for k in range(len(per_save_s))]
    fig.add_trace(
        go.Bar(
            x=steps,
            y=[1e3 * t for t in per_save_s],
            marker_color=[SET_APART] + [SAVE] * (len(per_save_s) - 1),
            text=[f"{1e3 * t:.0f}" for t in per_save_s],
            textposition="inside",
            insidetextanchor="start",
            name="a save, slowest rank (measured; grey: the first, which imports DCP)",
        ),
        row=1,
        col=2,
    )
    delta_ms = 1e3 * statistics.median(per_save_s[1:])
    fig.add_trace(
        go.Scatter(
            x=steps[1:],
            y=[delta_ms] * (len(steps) - 1),
            mode="lines",
            name=f"δ = {delta_ms:.1f} ms: the median after the first",
            line={"dash": "dot", "color": CURVE},
        ),
        row=1,
        col=2,
    )
    # the first save (DCP's import) is often 10× the others: cut above 3× the tallest of them, its value written
    fig.update_yaxes(title_text="ms", range=[0, 3e3 * max(per_save_s[1:])], row=1, col=2)
    fig.update_annotations(font_size=12)  # the panels' titles
    fig.update_layout(
        height=420,
        legend={"orientation": "h", "y": -0.25},
        margin={"t": 90, "b": 120},
        title="checkpoint interval at the cost measured here: yours beside the least waste",
        font={"size": 11},
    )
    return fig
