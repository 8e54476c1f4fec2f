"""Interactive explorers (ipywidgets + plotly FigureWidget) for Jupyter."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.analysis.run import Run
from workbench.viz.timeline import timeline


def timeline_explorer(run: Run) -> widgets.VBox:
    """A step slider over the run's timeline."""
    steps = sorted(int(s) for s in run.events.step.dropna().unique())
    fig = go.FigureWidget(timeline(run, steps=[steps[-1]]))
    fig.layout.autosize = True  # as wide as the notebook, like the charts around it
    slider = widgets.IntSlider(value=steps[-1], min=steps[0], max=steps[-1], description="step",
                               layout={"width": "60%"})

    def show(change: dict) -> None:
        new = timeline(run, steps=[change["new"]])
        with fig.batch_update():
            fig.data = []
            fig.add_traces(list(new.data))
            fig.layout.title = new.layout.title

    slider.observe(show, names="value")
    return widgets.VBox([slider, fig], layout={"width": "100%"})
