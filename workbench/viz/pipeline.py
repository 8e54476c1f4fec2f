"""The pipeline bubble chart: per rank, forward and backward of each microbatch, idle time shaded.

The same drawing serves the plan (a schedule simulated from per-action costs, no process needed) and
the measurement (a run's recorded forward/backward spans of one step), so the two sit side by side.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from workbench.pipeline.actions import peak_in_flight
from workbench.pipeline.schedule import build_schedule, simulate
from workbench.predict import formulas
from workbench.run import Run

PALETTE = qualitative.Plotly + qualitative.D3


def _bars(fig: go.Figure, rows: list[tuple[int, str, int, int, float, float]], row: int | None = None,
          legend: bool = True) -> None:
    """rows: (rank, kind F/B, stage, microbatch, start, end). Forward solid, backward hatched."""
    ranks = sorted({r[0] for r in rows})
    end = max((r[5] for r in rows), default=0.0)
    # idle: the whole span in grey underneath
    fig.add_trace(go.Bar(y=[f"rank {r}" for r in ranks], x=[end] * len(ranks), base=[0] * len(ranks), orientation="h",
                         marker_color="#E8E8E8", name="idle (bubble)", showlegend=legend, hoverinfo="skip"),
                  row=row, col=1 if row else None)
    shown = set()
    for rank, kind, stage, mb, start, stop in rows:
        key = (kind, mb)
        fig.add_trace(go.Bar(
            y=[f"rank {rank}"], x=[stop - start], base=[start], orientation="h",
            marker={"color": PALETTE[mb % len(PALETTE)], "pattern": {"shape": "/" if kind == "B" else ""},
                    "line": {"color": "white", "width": 1}},
            name=f"{'forward' if kind == 'F' else 'backward'} mb {mb}", legendgroup=f"mb{mb}",
            showlegend=legend and key not in shown, text=f"{stage}{kind}{mb}", textposition="inside",
            hovertemplate=f"stage {stage} {'forward' if kind == 'F' else 'backward'} microbatch {mb}<br>"
                          f"{start:.3f} → {stop:.3f}<extra></extra>"), row=row, col=1 if row else None)
        shown.add(key)


def planned(name: str, p: int, m: int, v: int = 1, t_f: float = 1.0, t_b: float = 2.0,
            t_comm: float = 0.0) -> go.Figure:
    """The simulated timeline of a schedule (each transfer between stages taking t_comm); the title
    carries its bubble beside the formula (which assumes free transfers), and each rank's label the most
    micro-batches whose activations it holds at once."""
    s = build_schedule(name, p, m, v)
    tl = simulate(s, t_f, t_b, t_comm)
    held = peak_in_flight(s)
    fig = go.Figure()
    _bars(fig, [(r, a.kind, a.stage, a.microbatch, b, e) for r, spans in enumerate(tl.spans) for a, b, e in spans])
    fig.update_layout(barmode="overlay", xaxis_title="time (one forward = 1)",
                      yaxis={"autorange": "reversed", "title": "rank (most micro-batches' activations held)",
                             "tickvals": [f"rank {r}" for r in range(p)],
                             "ticktext": [f"rank {r} · {held[r]}" for r in range(p)]},
                      uniformtext={"minsize": 9, "mode": "hide"},
                      title=f"{name}: p={p}, m={m}, v={v} — bubble {tl.bubble_fraction():.3f} "
                            f"(formula (p−1)/(v·m+p−1) = {formulas.bubble_fraction(p, m, v):.3f}"
                            + (f", free transfers; here each takes {t_comm:g})" if t_comm else ")"),
                      height=140 + 45 * p)
    return fig


def measured_rows(run: Run, step: int) -> list[tuple[int, str, int, int, float, float]]:
    ev = run.events
    ev = ev[(ev.lane == "compute") & ev.cat.isin(["forward", "backward"]) & (ev.step == step)]
    t0 = ev.start_us.min()
    return [(int(e["rank"]), "F" if e["cat"] == "forward" else "B", int(e["stage"]), int(e["microbatch"]),
             (e.start_us - t0) / 1e3, (e.end_us - t0) / 1e3) for _, e in ev.iterrows()]


def planned_vs_measured(run: Run, step: int | None = None) -> go.Figure:
    """Top: the run's schedule simulated with its measured mean forward and backward times.
    Bottom: what the ranks recorded in one step (default: the last)."""
    c = run.config
    ev = run.events
    step = int(ev.step.max()) if step is None else step
    rows = measured_rows(run, step)
    f = [e - b for _, k, _, _, b, e in rows if k == "F"]
    bw = [e - b for _, k, _, _, b, e in rows if k == "B"]
    v = c.get("virtual_stages", 1)
    s = build_schedule(c["schedule"] if c["pp"] > 1 else "1f1b", c["pp"], c["microbatches"], v)
    tl = simulate(s, sum(f) / len(f) * v, sum(bw) / len(bw) * v)
    bubble = run.summary.get("bubble_fraction", {})
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.2, subplot_titles=[
        f"planned (simulated with measured costs): bubble {tl.bubble_fraction():.3f}",
        f"measured, step {step}: bubble {bubble.get('measured') or 0:.3f} "
        f"(formula {formulas.bubble_fraction(s.p, s.m, s.v):.3f})"])
    _bars(fig, [(r, a.kind, a.stage, a.microbatch, b, e) for r, spans in enumerate(tl.spans) for a, b, e in spans],
          row=1)
    _bars(fig, rows, row=2, legend=False)
    fig.update_layout(barmode="overlay", height=260 + 90 * s.p, title=f"{c['schedule']} p={s.p} m={s.m} v={s.v}",
                      uniformtext={"minsize": 9, "mode": "hide"})
    fig.update_yaxes(autorange="reversed", title_text="rank")
    fig.update_xaxes(title_text="ms (simulated from the measured mean forward and backward)", row=1, col=1)
    fig.update_xaxes(title_text="ms (recorded)", row=2, col=1, showticklabels=True)
    return fig


def bubble_vs_m(runs: list[Run]) -> go.Figure:
    """Measured bubble fraction of each run against m, beside the formula's curve."""
    fig = go.Figure()
    by_schedule: dict[tuple, list[tuple[int, float]]] = {}
    for r in runs:
        c = r.config
        key = (c["schedule"], c["pp"], c.get("virtual_stages", 1))
        by_schedule.setdefault(key, []).append((c["microbatches"], r.summary["bubble_fraction"]["measured"]))
    for (name, p, v), points in by_schedule.items():
        points.sort()
        ms = [m for m, _ in points]
        fig.add_trace(go.Scatter(x=ms, y=[b for _, b in points], mode="markers+lines", name=f"{name} p={p} measured"))
        grid = list(range(1, max(ms) * 2 + 1))
        fig.add_trace(go.Scatter(x=grid, y=[formulas.bubble_fraction(p, m, v) for m in grid], mode="lines",
                                 line={"dash": "dash"}, name=f"(p−1)/(v·m+p−1), p={p}, v={v}"))
    fig.update_layout(xaxis_title="microbatches m", yaxis_title="bubble fraction of the step",
                      title="pipeline bubble against m: measured beside the formula")
    return fig


def bubble_explorer():  # noqa: ANN201 - an ipywidgets box
    """Sliders for p, m, v and the schedule, driving the simulator (no processes). A control the chosen
    schedule ignores is disabled (v for gpipe and 1f1b), and interleaved's rule — m a multiple of p — is
    the m slider's own step, so the slider always shows the m that is drawn."""
    import ipywidgets as widgets

    out = widgets.Output(layout={"width": "100%"})
    wide = {"style": {"description_width": "initial"}, "layout": {"width": "32%"}}
    schedule = widgets.Dropdown(options=["gpipe", "1f1b", "interleaved"], value="1f1b", description="schedule",
                                **wide)
    p = widgets.IntSlider(value=4, min=2, max=8, description="p (stages)", **wide)
    m = widgets.IntSlider(value=8, min=1, max=32, description="m (microbatches)", **wide)
    v = widgets.IntSlider(value=2, min=1, max=4, description="v (chunks per rank)", **wide)
    ratio = widgets.FloatSlider(value=2.0, min=0.5, max=4.0, step=0.5, description="t_b / t_f", **wide)
    comm = widgets.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.1, description="t_comm / t_f", **wide)

    def draw(_: object = None) -> None:
        interleaved = schedule.value == "interleaved"
        v.disabled = not interleaved
        v.description = "v (chunks per rank)" if interleaved else "v (interleaved only)"
        step = p.value if interleaved else 1
        if m.step != step:  # interleaving needs m to be a multiple of p: the slider moves in steps of p
            m.value = max(step, m.value - m.value % step)
            m.min, m.step = step, step
        out.clear_output(wait=True)
        with out:
            planned(schedule.value, p.value, m.value, v.value if interleaved else 1, 1.0, ratio.value,
                    comm.value).show()

    for w in (schedule, p, m, v, ratio, comm):
        w.observe(draw, names="value")
    draw()
    return widgets.VBox([widgets.HBox([schedule, ratio, comm]), widgets.HBox([p, m, v]), out],
                        layout={"width": "100%"})
