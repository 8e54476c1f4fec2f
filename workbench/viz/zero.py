"""ZeRO charts: model-state memory per rank across stages, measured beside predicted, and the formula
explorer of Rajbhandari et al. (Ψ, N, stage) that reproduces the paper's 7.5B-on-64-GPUs example."""

from __future__ import annotations

import plotly.graph_objects as go

from workbench.analysis.run import Run
from workbench.predict import formulas
from workbench.viz.memory import CATEGORY_COLORS

STATES = ("parameter", "gradient", "optimizer_state")
#: the explorer's Ψ choices: published model sizes (the paper's 7.5 B example among them)
MODEL_SIZES = {
    "124 M (GPT-2)": 124e6,
    "350 M": 350e6,
    "1.3 B": 1.3e9,
    "2.7 B": 2.7e9,
    "6.7 B": 6.7e9,
    "7.5 B (the paper)": 7.5e9,
    "13 B": 13e9,
    "30 B": 30e9,
    "70 B": 70e9,
    "175 B (GPT-3)": 175e9,
    "530 B": 530e9,
    "1 T": 1e12,
}


def stages_side_by_side(runs: dict[str, Run], rank: int = 0) -> go.Figure:
    """One pair of stacked bars per run for one rank: measured, each category at the moment their sum
    peaked (the bar's height is what the rank paid at once, `peak_total_bytes`); predicted, each
    category's formula. Stacking each category's own measured peak would overstate the total: they fall
    at different moments of the step."""
    fig = go.Figure()
    for cat in (*STATES, "activation", "temporary", "comm_buffer"):
        x0, x1, y = [], [], []
        for name, run in runs.items():
            r = next(x for x in run.summary["ranks"] if x["rank"] == rank)
            measured = r.get("bytes_at_peak_total") or r["peak_bytes"]
            for kind, source in (("measured", measured), ("predicted", r["predicted_bytes"])):
                x0.append(name)
                x1.append(kind)
                y.append(source.get(cat, 0) / 1e6)
        if any(y):
            fig.add_trace(
                go.Bar(
                    x=[x0, x1],
                    y=y,
                    name=cat,
                    marker_color=CATEGORY_COLORS.get(cat, "#888"),
                    hovertemplate=f"{cat}: %{{y:.4f}} MB<extra></extra>",
                )
            )
    totals = [
        (name, next(x for x in run.summary["ranks"] if x["rank"] == rank)["peak_total_bytes"] / 1e6)
        for name, run in runs.items()
    ]
    fig.add_trace(
        go.Scatter(
            x=[[t[0] for t in totals], ["measured"] * len(totals)],
            y=[t[1] for t in totals],
            mode="markers",
            name="simultaneous total (measured)",
            marker={"symbol": "line-ew-open", "size": 40, "color": "black", "line": {"width": 3}},
            hovertemplate="all categories at once: %{y:.4f} MB<extra></extra>",
        )
    )
    fig.update_layout(
        barmode="stack",
        yaxis_title="MB (measured: at the simultaneous peak)",
        title=f"memory of rank {rank} — ZeRO stages side by side, measured beside predicted",
    )
    return fig


#: the explorer's accountings: (precision, gradient bytes per parameter or None for the precision's own)
PRECISIONS = {
    "mixed (the paper: 16-bit gradients, 16Ψ)": ("mixed", None),
    "mixed, fp32 main gradients (Megatron, our default: 18Ψ)": ("mixed", 4),
    "fp32 (16Ψ)": ("fp32", None),
}


def formula_figure(
    params: float,
    n: int,
    precision: str = "mixed",
    *,
    highlight: int | None = None,
    grad_bytes: int | None = None,
    offload: bool = False,
) -> go.Figure:
    """Model states per GPU (GB = 1e9 bytes) for stages 0–3; `grad_bytes=4` with mixed precision: fp32
    main gradients (18Ψ); `offload`: ZeRO-Offload moves the optimizer states of stages 1–3 to the host
    (the host's 16Ψ/N is in the hover text, not the device's bars)."""
    fig = go.Figure()
    names = [f"stage {z}" + (" + offload" if offload and z else "") for z in range(4)]
    per_stage = [
        formulas.model_state_bytes(
            params, n, z, precision, grad_bytes=grad_bytes, offload=offload and z > 0
        )
        for z in range(4)
    ]
    for cat in STATES:
        fig.add_trace(
            go.Bar(
                x=names,
                y=[s[cat] / 1e9 for s in per_stage],
                name=cat,
                marker_color=CATEGORY_COLORS[cat],
            )
        )
    totals = [sum(s.values()) / 1e9 for s in per_stage]
    fig.add_trace(
        go.Scatter(
            x=names,
            y=totals,
            mode="text",
            text=[f"{t:.1f} GB" for t in totals],
            textposition="top center",
            name="total per GPU",
            showlegend=False,
            hovertemplate="%{x}: %{y:.2f} GB in all<extra>total per GPU</extra>",
        )
    )
    if highlight is not None:
        fig.add_vrect(
            x0=highlight - 0.45,
            x1=highlight + 0.45,
            line_width=2,
            line_color="black",
            fillcolor="rgba(0,0,0,0)",
        )
    fig.update_layout(
        barmode="stack",
        yaxis_title="GB of model states per GPU",
        xaxis_title="ZeRO stage",
        yaxis_range=[0, max(totals) * 1.18],  # room for the top bar's label
        legend_title_text="model state",
        title=f"Ψ = {params / 1e9:g} B parameters on N = {n} GPUs ({precision}"
        + (", fp32 gradients" if grad_bytes == 4 and precision == "mixed" else "")
        + (f"; offload: the host holds {16 * params / n / 1e9:.2f} GB per GPU" if offload else "")
        + ")",
    )
    return fig


def formula_explorer(params: float = 7.5e9, n: int = 64, precision: str = "mixed"):
    """Sliders for Ψ (billions), N and the stage; the chart and the per-GPU total follow."""
    import ipywidgets as widgets

    # named sizes, not a log slider: a log slider's steps snapped the paper's 7.5 B to 7.59 B
    extra = {} if params in MODEL_SIZES.values() else {f"{params / 1e9:g} B": params}
    sizes = sorted({**MODEL_SIZES, **extra}.items(), key=lambda kv: kv[1])
    psi = widgets.SelectionSlider(
        options=sizes,
        value=params,
        description="Ψ",
        style={"description_width": "initial"},
        layout={"width": "45%"},
    )
    gpus = widgets.IntSlider(value=n, min=1, max=1024, description="N (GPUs)")
    stage = widgets.IntSlider(value=3, min=0, max=3, description="stage")
    first = next(k for k, v in PRECISIONS.items() if v[0] == precision)
    prec = widgets.Dropdown(
        options=list(PRECISIONS),
        value=first,
        description="precision",
        style={"description_width": "initial"},
        layout={"width": "60%"},
    )
    offload = widgets.Checkbox(
        value=False,
        description="ZeRO-Offload (optimizer states on the host)",
        style={"description_width": "initial"},
        layout=widgets.Layout(width="auto"),
    )
    out = widgets.Output()
    text = widgets.HTML()

    def draw(_: object = None) -> None:
        p, g = PRECISIONS[prec.value]
        off = offload.value and stage.value > 0
        states = formulas.model_state_bytes(
            psi.value, gpus.value, stage.value, p, grad_bytes=g, offload=off
        )
        host = f"; the host holds {16 * psi.value / gpus.value / 1e9:.2f} GB per GPU" if off else ""
        text.value = f"<b>ZeRO-{stage.value}: {sum(states.values()) / 1e9:.2f} GB of model states per GPU{host}</b>"
        out.clear_output(wait=True)
        with out:
            formula_figure(
                psi.value,
                gpus.value,
                p,
                highlight=stage.value,
                grad_bytes=g,
                offload=offload.value,
            ).show()

    for w in (psi, gpus, stage, prec, offload):
        w.observe(draw, names="value")
    draw()
    return widgets.VBox(
        [widgets.HBox([psi, gpus]), widgets.HBox([stage, prec]), offload, text, out]
    )
