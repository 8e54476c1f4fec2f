"""The learner's timeline beside the reference's: the same steps, ranks and lanes, on one time axis, so that a
longer step, an extra collective or a rank that waits shows where it differs."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.run import Run
from workbench.viz.timeline import timeline


def side_by_side(
    learner: Run, reference: Run, title: str, steps: list[int] | None = None
) -> go.Figure:
    """Two timelines (viz.timeline) in columns, yours on the left, on one time axis (the x axes matched)."""
    yours, ref = timeline(learner, steps=steps), timeline(reference, steps=steps)
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_xaxes=True,
        shared_yaxes=True,
        horizontal_spacing=0.03,
        subplot_titles=("your solution", "the reference"),
    )
    shown: set[str] = set()
    for col, part in ((1, yours), (2, ref)):
        for trace in part.data:
            trace.showlegend = trace.name not in shown
            trace.legendgroup = trace.name
            shown.add(str(trace.name))
            fig.add_trace(trace, row=1, col=col)
    rows = list(yours.layout.yaxis.categoryarray or [])
    rows += [r for r in (ref.layout.yaxis.categoryarray or []) if r not in rows]
    fig.update_yaxes(categoryorder="array", categoryarray=rows)
    fig.update_xaxes(
        title_text="time (ms)", matches="x"
    )  # one time scale: a longer step looks longer
    fig.update_layout(
        title=f"{title}: your timeline beside the reference's",
        barmode="overlay",
        height=max(yours.layout.height or 300, ref.layout.height or 300),
        legend=yours.layout.legend,
        margin={"l": 150, "b": 110},
    )
    return fig
