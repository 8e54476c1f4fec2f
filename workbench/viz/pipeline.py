"""The pipeline bubble chart: per rank, forward and backward of each microbatch, idle time shaded (a split
backward: I and W, each with its own pattern).

The same drawing serves the plan (a schedule simulated from per-action costs, no process needed) and
the measurement (a run's recorded forward/backward spans of one step), so the two sit side by side.
"""

from __future__ import annotations

import statistics

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from workbench.analysis.dualpipe_runs import SPAN_KIND, pair_numbers
from workbench.analysis.run import Run
from workbench.predict import formulas
from workbench.predict.formulas.zero_bubble import dualpipe_bubble
from workbench.schedules.actions import peak_in_flight
from workbench.schedules.build import build_schedule, simulate
from workbench.schedules.simulator import Timeline

PALETTE = qualitative.Plotly + qualitative.D3
#: per kind of compute action: its name and the pattern its bars carry (forward solid)
KINDS = {
    "F": ("forward", ""),
    "B": ("backward", "/"),
    "I": ("input gradient (I)", "x"),
    "W": ("weight gradient (W)", "."),
}


def _bars(
    fig: go.Figure,
    rows: list[tuple[int, str, int, int, float, float]],
    row: int | None = None,
    legend: bool = True,
) -> None:
    """rows: (rank, kind F/B/I/W, stage, microbatch, start, end). Forward solid, the backwards patterned."""
    ranks = sorted({r[0] for r in rows})
    end = max((r[5] for r in rows), default=0.0)
    # idle: the whole span in grey underneath
    fig.add_trace(
        go.Bar(
            y=[f"rank {r}" for r in ranks],
            x=[end] * len(ranks),
            base=[0] * len(ranks),
            orientation="h",
            marker_color="#E8E8E8",
            name="idle (bubble)",
            showlegend=legend,
            hoverinfo="skip",
        ),
        row=row,
        col=1 if row else None,
    )
    shown = set()
    for rank, kind, stage, mb, start, stop in rows:
        key = (kind, mb)
        fig.add_trace(
            go.Bar(
                y=[f"rank {rank}"],
                x=[stop - start],
                base=[start],
                orientation="h",
                marker={
                    "color": PALETTE[mb % len(PALETTE)],
                    "pattern": {"shape": KINDS[kind][1]},
                    "line": {"color": "white", "width": 1},
                },
                name=f"{KINDS[kind][0]} mb {mb}",
                legendgroup=f"mb{mb}",
                showlegend=legend and key not in shown,
                text=f"{stage}{kind}{mb}",
                textposition="inside",
                hovertemplate=f"stage {stage} {KINDS[kind][0]} microbatch {mb}<br>"
                f"{start:.3f} → {stop:.3f}<extra></extra>",
            ),
            row=row,
            col=1 if row else None,
        )
        shown.add(key)


def planned(
    name: str,
    p: int,
    m: int,
    v: int = 1,
    *,
    t_f: float = 1.0,
    t_b: float = 2.0,
    t_comm: float = 0.0,
    t_w: float | None = None,
    t_fb: float | None = None,
) -> go.Figure:
    """The simulated timeline of a schedule (each transfer between stages taking t_comm; a split
    backward's W taking t_w of t_b, half by default; DualPipe's F&B pair t_fb, t_f + t_b by default); the
    title carries its bubble beside the formula (which assumes free transfers, and for the zero-bubble
    schedules T_F = T_I = T_W) and the paper's bubble rate, and each rank's label the most micro-batches
    whose activations it holds at once. DualPipe and DualPipeV are simulated under gloo's rule (a send
    never waits for its receive), as DeepSeek's formula, in their title, assumes; the others under
    NCCL's."""
    s = build_schedule(name, p, m, v)
    dual = name in ("dualpipe", "dualpipev")
    tl = simulate(s, t_f, t_b, t_comm, t_w=t_w, t_fb=t_fb, rule="gloo" if dual else "nccl")
    held = peak_in_flight(s)
    v = s.v
    fig = go.Figure()
    _bars(
        fig,
        [
            (r, a.kind, a.stage, a.microbatch, b, e)
            for r, spans in enumerate(tl.spans)
            for a, b, e in spans
        ],
    )
    _outline_pairs(fig, [(r, a.pair, b, e) for r, sp in enumerate(tl.spans) for a, b, e in sp])
    fig.update_layout(
        barmode="overlay",
        xaxis_title="time (one forward = 1)",
        yaxis={
            "autorange": "reversed",
            "title": "rank (most micro-batches' activations held)",
            "tickvals": [f"rank {r}" for r in range(p)],
            "ticktext": [f"rank {r} · {held[r]}" for r in range(p)],
        },
        uniformtext={"minsize": 9, "mode": "hide"},
        title=f"{name}: p={p}, m={m}, v={v} — bubble {tl.bubble_fraction():.3f} of the step"
        + (
            _dualpipe_line(
                name,
                tl,
                t_f=t_f,
                t_b=t_b,
                t_w=t_b / 2 if t_w is None else t_w,
                t_fb=t_fb,
                t_comm=t_comm,
            )
            if dual
            else f" (formula {formulas.schedule_bubble_fraction(s):.3f}"
            + (f", free transfers; here each takes {t_comm:g})" if t_comm else ")")
            + f"<br>bubble rate {tl.bubble_rate():.3f} (idle ÷ work; at T_F = T_I = T_W the paper's "
            f"{formulas.RATES.get(name, '?')} = {_rate(name, p, m, v)})"
        ),
        height=140 + 45 * p,
    )
    return fig


def _dualpipe_line(
    name: str,
    tl: Timeline,
    *,
    t_f: float,
    t_b: float,
    t_w: float,
    t_fb: float | None,
    t_comm: float = 0.0,
) -> str:
    """DualPipe(V)'s idle per rank beside DeepSeek's (PP/2 − 1)(F&B + B − 3W), with each stage's costs (a
    V's stage: half a rank's)."""
    k = 0.5 if name == "dualpipev" else 1.0
    stages = 2 * len(tl.spans) if name == "dualpipev" else len(tl.spans)
    formula = dualpipe_bubble(
        stages, f=k * t_f, b=k * t_b, w=k * t_w, fb=None if t_fb is None else k * t_fb
    )
    idle = tl.idle_per_rank()
    return (
        f"<br>idle per rank {idle:.2f}; DeepSeek's (PP/2 − 1)(F&B + B − 3W) = {formula:.2f} "
        f"(PP = {stages} stages; gloo's rule: sends never wait, as the formula assumes"
        + (f"; here each transfer takes {t_comm:g})" if t_comm else ")")
    )


def _outline_pairs(
    fig: go.Figure, spans: list[tuple[int, int | None, float, float]], row: int | None = None
) -> None:
    """A black border around each F&B pair's two bars (DeepSeek's figures draw pairs so): spans are
    (rank, pair or None, start, end); the rank's bar row is its index on the y axis."""
    boxes: dict[tuple[int, int], list[float]] = {}
    for rank, pair, start, end in spans:
        if pair is not None:
            boxes.setdefault((rank, pair), []).extend((start, end))
    for (rank, _), ends in boxes.items():
        fig.add_shape(
            type="rect",
            x0=min(ends),
            x1=max(ends),
            y0=rank - 0.45,
            y1=rank + 0.45,
            line={"color": "black", "width": 2},
            row=row,
            col=1 if row else None,
        )
    if boxes:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="lines",
                line={"color": "black", "width": 2},
                name="F&B pair (outlined: its F, then its B)",
                showlegend=row in (None, 1),
            ),
            row=row,
            col=1 if row else None,
        )


def _rate(name: str, p: int, m: int, v: int) -> str:
    try:
        return f"{formulas.bubble_rate(name, p, m, v):.3f}"
    except ValueError:
        return "—"


def measured_rows(run: Run, step: int) -> list[tuple[int, str, int, int, float, float]]:
    ev = run.events
    ev = ev[(ev.lane == "compute") & ev.name.isin(list(SPAN_KIND)) & (ev.step == step)]
    t0 = ev.start_us.min()
    return [
        (
            int(e["rank"]),
            SPAN_KIND[e["name"]],
            int(e["stage"]),
            int(e["microbatch"]),
            (e.start_us - t0) / 1e3,
            (e.end_us - t0) / 1e3,
        )
        for _, e in ev.iterrows()
    ]


def planned_vs_measured(run: Run, step: int | None = None) -> go.Figure:
    """Top: the run's schedule simulated with its measured mean forward and backward times.
    Bottom: what the ranks recorded in one step (default: the last). DualPipe's F&B pairs outlined in
    both."""
    c = run.config
    ev = run.events
    step = int(ev.step.max()) if step is None else step
    rows = measured_rows(run, step)
    mean = {
        k: statistics.mean([e - b for _, kind, _, _, b, e in rows if kind == k] or [0.0])
        for k in KINDS
    }
    v = c.get("virtual_stages", 1)
    s = build_schedule(c["schedule"] if c["pp"] > 1 else "1f1b", c["pp"], c["microbatches"], v)
    tl = simulate(
        s,
        cost=lambda r, item: (
            (mean[item.kind], mean[item.kind]) if item.kind in KINDS else (0.0, 0.0)
        ),
    )
    bubble = run.summary.get("bubble_fraction", {})
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.2,
        subplot_titles=[
            f"planned (simulated with measured costs): bubble {tl.bubble_fraction():.3f}",
            f"measured, step {step}: bubble {bubble.get('measured') or 0:.3f} "
            f"(formula {formulas.schedule_bubble_fraction(s):.3f})",
        ],
    )
    _bars(
        fig,
        [
            (r, a.kind, a.stage, a.microbatch, b, e)
            for r, spans in enumerate(tl.spans)
            for a, b, e in spans
        ],
        row=1,
    )
    _bars(fig, rows, row=2, legend=False)
    pair = pair_numbers(run)
    _outline_pairs(
        fig, [(r, a.pair, b, e) for r, sp in enumerate(tl.spans) for a, b, e in sp], row=1
    )
    _outline_pairs(
        fig, [(r, pair.get((r, step, st, mb, k)), b, e) for r, k, st, mb, b, e in rows], row=2
    )
    fig.update_layout(
        barmode="overlay",
        height=260 + 90 * s.p,
        title=f"{c['schedule']} p={s.p} m={s.m} v={s.v}",
        uniformtext={"minsize": 9, "mode": "hide"},
    )
    fig.update_yaxes(autorange="reversed", title_text="rank")
    fig.update_xaxes(
        title_text="ms (simulated from the measured mean time of each kind of action)", row=1, col=1
    )
    fig.update_xaxes(title_text="ms (recorded)", row=2, col=1, showticklabels=True)
    return fig


def bubble_vs_m(runs: list[Run]) -> go.Figure:
    """Measured bubble fraction of each run against m, beside the formula's curve."""
    fig = go.Figure()
    by_schedule: dict[tuple, list[tuple[int, float]]] = {}
    for r in runs:
        c = r.config
        key = (c["schedule"], c["pp"], c.get("virtual_stages", 1))
        by_schedule.setdefault(key, []).append(
            (c["microbatches"], r.summary["bubble_fraction"]["measured"])
        )
    for (name, p, v), points in by_schedule.items():
        points.sort()
        ms = [m for m, _ in points]
        fig.add_trace(
            go.Scatter(
                x=ms, y=[b for _, b in points], mode="markers+lines", name=f"{name} p={p} measured"
            )
        )
        grid = list(range(1, max(ms) * 2 + 1))
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=[formulas.bubble_fraction(p, m, v) for m in grid],
                mode="lines",
                line={"dash": "dash"},
                name=f"(p−1)/(v·m+p−1), p={p}, v={v}",
            )
        )
    fig.update_layout(
        xaxis_title="microbatches m",
        yaxis_title="bubble fraction of the step",
        title="pipeline bubble against m: measured beside the formula",
    )
    return fig


def _m_rule(schedule: str, p: int) -> tuple[int, int]:
    """The least m and its step a schedule accepts at p: interleaved a multiple of p, DualPipeV at least
    2p (one microbatch per stage), DualPipe an even number at least 2p (half enter at each end)."""
    return {"interleaved": (p, p), "dualpipev": (2 * p, 1), "dualpipe": (2 * p, 2)}.get(
        schedule, (1, 1)
    )


def bubble_explorer():  # an ipywidgets box
    """Sliders for p, m, v and the schedule, driving the simulator (no processes). A control the chosen
    schedule ignores is disabled (v for all but interleaved, T_W / T_B for the schedules without a split
    backward, F&B for all but DualPipe(V)), and each schedule's rule on m — interleaved's a multiple of
    p, DualPipe(V)'s at least 2p (DualPipe's even, with p even) — is the sliders' own minimum and step, so
    the sliders always show what is drawn. T_W / T_B is the share of a backward that is weight gradient:
    ½ is T_I = T_W, where ZBV's bubble is zero; move it and the bubble comes back. F&B ÷ (t_f + t_b) is
    DualPipe's pair: 1 where nothing overlaps (one CPU thread), less where the pair hides communication."""
    import ipywidgets as widgets

    out = widgets.Output(layout={"width": "100%"})
    wide = {"style": {"description_width": "initial"}, "layout": {"width": "32%"}}
    schedule = widgets.Dropdown(
        options=["gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev", "dualpipe"],
        value="1f1b",
        description="schedule",
        **wide,
    )
    p = widgets.IntSlider(value=4, min=2, max=8, description="p (stages)", **wide)
    m = widgets.IntSlider(value=8, min=1, max=32, description="m (microbatches)", **wide)
    v = widgets.IntSlider(value=2, min=1, max=4, description="v (chunks per rank)", **wide)
    ratio = widgets.FloatSlider(
        value=2.0, min=0.5, max=4.0, step=0.5, description="t_b / t_f", **wide
    )
    comm = widgets.FloatSlider(
        value=0.0, min=0.0, max=1.0, step=0.1, description="t_comm / t_f", **wide
    )
    w_share = widgets.FloatSlider(
        value=0.5, min=0.1, max=0.9, step=0.05, description="T_W / T_B", **wide
    )
    fb_share = widgets.FloatSlider(
        value=1.0, min=0.5, max=1.0, step=0.05, description="F&B ÷ (t_f + t_b)", **wide
    )
    settling = [False]  # the sliders being moved to a valid place: no drawing until they are

    def settle() -> None:
        dual = schedule.value == "dualpipe"
        p.step = 2 if dual else 1
        if dual and p.value % 2:
            p.value += 1  # DualPipe's two pipelines meet in the middle: p even
        lo, step = _m_rule(schedule.value, p.value)
        target = max(lo, m.value - m.value % step)
        if (m.min, m.step, m.value) != (lo, step, target):
            m.min = min(m.min, lo)
            m.value = target
            m.min, m.step = lo, step

    def draw(_: object = None) -> None:
        if settling[0]:
            return
        settling[0] = True
        try:
            settle()
        finally:
            settling[0] = False
        interleaved = schedule.value == "interleaved"
        w_share.disabled = schedule.value not in ("zbh1", "zbv", "dualpipev", "dualpipe")
        fb_share.disabled = schedule.value not in ("dualpipev", "dualpipe")
        v.disabled = not interleaved
        v.description = "v (chunks per rank)" if interleaved else "v (interleaved only)"
        out.clear_output(wait=True)
        with out:
            planned(
                schedule.value,
                p.value,
                m.value,
                v.value if interleaved else 1,
                t_f=1.0,
                t_b=ratio.value,
                t_comm=comm.value,
                t_w=w_share.value * ratio.value,
                t_fb=fb_share.value * (1.0 + ratio.value),
            ).show()

    for w in (schedule, p, m, v, ratio, comm, w_share, fb_share):
        w.observe(draw, names="value")
    draw()
    return widgets.VBox(
        [
            widgets.HBox([schedule, ratio, comm]),
            widgets.HBox([p, m, v]),
            widgets.HBox([w_share, fb_share]),
            out,
        ],
        layout={"width": "100%"},
    )
