"""Interactive explorers (ipywidgets, with plotly charts drawn in an Output widget) for Jupyter."""

from __future__ import annotations

import ipywidgets as widgets

from workbench.analysis.run import Run
from workbench.viz.timeline import timeline


def timeline_explorer(run: Run) -> widgets.VBox:
    """A step slider over the run's timeline; each step's chart is drawn again in an Output widget
    (ipywidgets' `interactive_output`, which `interact` uses too).

    Not a plotly FigureWidget: its saved widget state carries plotly.js as a 5 MB module (a saved notebook
    grew from under 1 MB to 5.7 MB), which a reopened notebook must evaluate before the chart shows. On a
    busy machine that took longer than JupyterLab's widget manager waits for a model (2 s), and the output
    read "Error displaying widget: model not found". An Output widget saves only the chart it shows."""
    steps = sorted(int(s) for s in run.events.step.dropna().unique())
    slider = widgets.IntSlider(
        value=steps[-1], min=steps[0], max=steps[-1], description="step", layout={"width": "60%"}
    )
    chart = widgets.interactive_output(
        lambda step: timeline(run, steps=[step]).show(), {"step": slider}
    )
    chart.layout.width = "100%"
    return widgets.VBox([slider, chart], layout={"width": "100%"})
