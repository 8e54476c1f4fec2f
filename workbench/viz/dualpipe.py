"""DualPipe and DualPipeV (DeepSeek-V3, 2024; the V is Sea AI Lab's "cut-in-half") simulated beside 1F1B
and ZBV: no process, the schedules as data (schedules/dualpipe.py) replayed from per-action costs.

    beside(p, m, t_f=, t_b=, t_w=, t_fb=)   the four timelines on one time axis, each F&B pair outlined,
                                            each title with the step, the idle per rank and the
                                            deepseek-ai/DualPipe README's formula for it
    formula_table(...)                      the idle per rank simulated beside the README's formula, for
                                            several P and costs: free transfers, and NCCL's rule
    what_if(costs, p, m, hidden=)           the step re-costed for a GPU whose F&B pair hides a share c
                                            of its F's and I's time (their communication): predicted
    idle_against_m(costs, p, ms)            the idle per rank of each schedule at several m, nothing hidden
    dualpipe_explorer()                     sliders for P, m and the F, B, W and F&B costs over `beside`

Costs are one rank's share of the model, as in `simulate`: a V's stage (ZBV, DualPipeV: 2p stages over p
ranks) costs half, a DualPipe stage (1/p of one of its two copies) all of it. The README's F, B, W are
one stage's, so the formula takes the stage's costs. The simulation beside the formula runs under gloo's
rule (a send never waits for its receive): the formula assumes free transfers. Under NCCL's rule a send
may wait for its receive, and DualPipe(V) idle more at P ≥ 4 (`formula_table` shows both).

The formula is exact where the costs are the zero-bubble paper's equal ones, F = I = W (B = 2F), and an
F&B pair takes between B and F + B: there the simulation at free transfers gives it for P = 2 … 8. Away
from them it is an estimate: with W shorter than I the schedule idles less than it says, with F&B
shorter than B (a pair that hides more than the forward's worth of time) more.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.dualpipe_runs import LABELS, deepseek_idle, idle_per_rank
from workbench.schedules.build import build_schedule, simulate
from workbench.schedules.simulator import Timeline
from workbench.viz.pipeline import KINDS, PALETTE

#: the schedules drawn beside each other, in this order
BESIDE = ("1f1b", "zbv", "dualpipev", "dualpipe")
#: a pair's outline: DeepSeek's figures enclose a pair's two cells in one black border
PAIR_LINE = {"color": "black", "width": 2}


def _share(name: str) -> float:
    """A stage's share of a rank's costs: half on a V, all of it otherwise."""
    return 0.5 if name in ("zbv", "dualpipev") else 1.0


def readme_idle(
    name: str, p: int, *, t_f: float, t_b: float, t_w: float, t_fb: float | None = None
) -> float | None:
    """The README's bubble for `name` at p ranks, from a rank's costs (each stage's share of them)."""
    k = _share(name)
    return deepseek_idle(
        name, p, f=k * t_f, b=k * t_b, w=k * t_w, fb=None if t_fb is None else k * t_fb
    )


def timeline(
    name: str,
    p: int,
    m: int,
    *,
    t_f: float,
    t_b: float,
    t_w: float,
    t_fb: float | None = None,
    rule: str = "gloo",
) -> Timeline:
    """`name` simulated at p ranks and m microbatches with a rank's costs (free transfers)."""
    return simulate(build_schedule(name, p, m), t_f, t_b, t_w=t_w, t_fb=t_fb, rule=rule)


def _draw(fig: go.Figure, tl: Timeline, row: int, legend: set[str]) -> None:
    """One bar trace per kind (F solid, B, I, W patterned), one colour per microbatch, and the F&B pairs
    outlined: a compact drawing (a few traces per timeline) that stays quick at P = 8, m = 32. `legend`:
    the kinds already in the legend (each enters it once, from the first timeline that has it)."""
    for kind, (what, pattern) in KINDS.items():
        spans = [
            (r, a, b, e) for r, rank in enumerate(tl.spans) for a, b, e in rank if a.kind == kind
        ]
        if not spans:
            continue
        fig.add_trace(
            go.Bar(
                y=[r for r, *_ in spans],
                x=[e - b for *_, b, e in spans],
                base=[b for *_, b, _ in spans],
                orientation="h",
                width=0.8,
                marker={
                    "color": [PALETTE[a.microbatch % len(PALETTE)] for _, a, *_ in spans],
                    "pattern": {"shape": pattern},
                    "line": {"color": "white", "width": 1},
                },
                text=[str(a) for _, a, *_ in spans],
                textposition="inside",
                name=what,
                legendgroup=kind,
                showlegend=kind not in legend,
                hovertemplate="%{text}: %{base:.2f} → %{x:.2f} long<extra></extra>",
            ),
            row=row,
            col=1,
        )
        legend.add(kind)
    xs: list[float | None] = []
    ys: list[float | None] = []
    for r, rank in enumerate(tl.spans):
        ends: dict[int, list[float]] = {}
        for a, b, e in rank:
            if a.pair is not None:
                ends.setdefault(a.pair, []).extend((b, e))
        for span in ends.values():
            x0, x1 = min(span), max(span)
            xs += [x0, x1, x1, x0, x0, None]
            ys += [r - 0.45, r - 0.45, r + 0.45, r + 0.45, r - 0.45, None]
    if xs:
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                line=PAIR_LINE,
                name="F&B pair (outlined)",
                legendgroup="pair",
                showlegend="pair" not in legend,
                hoverinfo="skip",
            ),
            row=row,
            col=1,
        )
        legend.add("pair")


def _title(name: str, tl: Timeline, formula: float | None) -> str:
    said = (
        f"README's formula {formula:.2f}"
        if formula is not None
        else "not in the README's table (the ZB paper: rate 0 at T_F = T_I = T_W)"
    )
    return f"{LABELS[name]}: step {tl.makespan:.2f}, idle per rank {idle_per_rank(tl):.2f} — {said}"


def beside(
    p: int,
    m: int,
    *,
    t_f: float = 1.0,
    t_b: float = 2.0,
    t_w: float = 1.0,
    t_fb: float | None = None,
) -> go.Figure:
    """1F1B, ZBV, DualPipeV and DualPipe at p ranks and m microbatches on one time axis, simulated with a
    rank's costs t_f, t_b, t_w and an F&B pair's t_fb (t_f + t_b unless given) under free transfers; each
    title gives the step, the idle per rank and the README's formula."""
    timelines = {n: timeline(n, p, m, t_f=t_f, t_b=t_b, t_w=t_w, t_fb=t_fb) for n in BESIDE}
    fig = make_subplots(
        rows=len(BESIDE),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.5 / (len(BESIDE) * 2 + p),
        subplot_titles=[
            _title(n, tl, readme_idle(n, p, t_f=t_f, t_b=t_b, t_w=t_w, t_fb=t_fb))
            for n, tl in timelines.items()
        ],
    )
    shown: set[str] = set()
    for i, tl in enumerate(timelines.values()):
        _draw(fig, tl, row=i + 1, legend=shown)
        fig.update_yaxes(
            autorange="reversed",
            tickvals=list(range(p)),
            ticktext=[f"rank {r}" for r in range(p)],
            row=i + 1,
            col=1,
        )
    pair = t_f + t_b if t_fb is None else t_fb
    fig.update_layout(
        barmode="overlay",
        height=180 + len(BESIDE) * (50 + 24 * p),
        uniformtext={"minsize": 8, "mode": "hide"},
        legend={"orientation": "h", "y": -0.08},
        title=f"P = {p} ranks, m = {m}: F {t_f:g}, B {t_b:g}, W {t_w:g}, F&B {pair:g} (a rank's share; "
        "a V's stage costs half) — free transfers, as the formula assumes",
    )
    fig.update_xaxes(title_text="time (simulated)", row=len(BESIDE), col=1)
    return fig


#: (what the case shows, a rank's t_f, t_b, t_w, t_fb) for `formula_table`: the README's formula is exact in
#: the first three (F = I = W, B ≤ F&B ≤ F + B), and only an estimate in the others
CASES = (
    ("F = I = W, nothing overlaps", 1.0, 2.0, 1.0, 3.0),
    ("F = I = W, F&B halfway from B to F + B", 1.0, 2.0, 1.0, 2.5),
    ("F = I = W, F&B = B", 1.0, 2.0, 1.0, 2.0),
    ("W shorter than I", 1.0, 2.0, 0.5, 3.0),
    ("F&B shorter than B", 1.0, 2.0, 1.0, 1.5),
)


#: formula_table's columns: the idle per rank, in a rank's F (the costs' unit)
SIMULATED = "idle per rank (in a rank's F), simulated, free transfers"
README = "README's formula, with a stage's costs"
UNDER_NCCL = "simulated under NCCL's rule"


def _costs_text(k: float, t_f: float, t_b: float, t_w: float, t_fb: float) -> str:
    return f"F {k * t_f:g}, B {k * t_b:g}, W {k * t_w:g}, F&B {k * t_fb:g}"


def formula_table(ps: tuple[int, ...] = (2, 4, 8), cases: tuple = CASES) -> list[dict]:
    """Rows: DualPipeV and DualPipe at each P (m = 4P) and each case of costs (`CASES`: a rank's t_f, t_b,
    t_w, t_fb), with the stage's costs the README's formula takes (half a rank's on the V): the idle per
    rank simulated under free transfers (`SIMULATED`), the README's formula (`README`), and the
    simulation under NCCL's rule (`UNDER_NCCL`), all in a rank's F."""
    rows = []
    for name in ("dualpipev", "dualpipe"):
        for p in ps:
            for case, t_f, t_b, t_w, t_fb in cases:
                costs = {"t_f": t_f, "t_b": t_b, "t_w": t_w, "t_fb": t_fb}
                rows.append(
                    {
                        "schedule": LABELS[name],
                        "P ranks": p,
                        "m": 4 * p,
                        "costs (a rank's)": _costs_text(1.0, t_f, t_b, t_w, t_fb),
                        "costs (a stage's)": _costs_text(_share(name), t_f, t_b, t_w, t_fb),
                        "case": case,
                        SIMULATED: idle_per_rank(timeline(name, p, 4 * p, **costs)),
                        README: readme_idle(name, p, **costs),
                        UNDER_NCCL: idle_per_rank(timeline(name, p, 4 * p, **costs, rule="nccl")),
                    }
                )
    return rows


#: the schedules of the what-if, in its columns' order
WHAT_IF = ("1f1b", "zbh1", "zbv", "dualpipev", "dualpipe")


def pair_cost(costs: dict[str, float], c: float) -> float:
    """An F&B pair's time on a GPU whose measured F and B hold a share c of communication (an expert
    all-to-all, a send) in their F and I: in a pair each runs beside the other's computation, so the pair
    costs (1 − c)(F + I) + W, I = B − W. W has no communication: nothing hides it. c ≤ ½: past it the
    communication, c(F + I), would be the longer part."""
    if not 0.0 <= c <= 0.5:
        raise ValueError(f"c={c}: the share of F and I that is communication must be in [0, 0.5]")
    return (1 - c) * (costs["t_f"] + costs["t_b"] - costs["t_w"]) + costs["t_w"]


def what_if(
    costs: dict[str, float], p: int, m: int, *, hidden: tuple[float, ...] = (0.0, 0.25, 0.5)
) -> list[dict]:
    """The step (ms) of 1F1B, ZB-H1, ZBV, DualPipeV and DualPipe at p ranks and m microbatches, simulated
    under free transfers with a rank's measured costs (`costs`: t_f, t_b, t_w in ms), read as a GPU's
    of which a share c (each of `hidden`) in F and I is communication that a pair hides (`pair_cost`).
    An action outside a pair keeps its whole time; c = 0 is this machine, where nothing overlaps. The
    pipeline only: DualPipe's exchange of gradients with its twin and its update of twice the parameters
    are not in it. Predicted, not measured."""
    rows = []
    for c in hidden:
        t_fb = pair_cost(costs, c)
        rows.append(
            {
                "pair hides c of F and I": c,
                **{
                    f"{LABELS[n]} step (ms)": timeline(
                        n, p, m, t_f=costs["t_f"], t_b=costs["t_b"], t_w=costs["t_w"], t_fb=t_fb
                    ).makespan
                    for n in WHAT_IF
                },
            }
        )
    return rows


def idle_against_m(costs: dict[str, float], p: int, ms: tuple[int, ...]) -> list[dict]:
    """Per m: the idle per rank (ms) of each schedule of `WHAT_IF`, simulated under free transfers with a
    rank's costs (`costs`: t_f, t_b, t_w) and nothing hidden (c = 0)."""
    return [
        {
            "m": m,
            **{
                LABELS[n]: idle_per_rank(
                    timeline(n, p, m, t_f=costs["t_f"], t_b=costs["t_b"], t_w=costs["t_w"])
                )
                for n in WHAT_IF
            },
        }
        for m in ms
    ]


def dualpipe_explorer():  # an ipywidgets box
    """Sliders for P (even: DualPipe's two pipelines meet in the middle), m (even, at least 2P: one
    microbatch per stage), a rank's F and B, W as a share of B and F&B as a share of F + B (1: nothing
    overlaps, as on this machine), over `beside`."""
    import ipywidgets as widgets

    out = widgets.Output(layout={"width": "100%"})
    wide = {"style": {"description_width": "initial"}, "layout": {"width": "32%"}}
    p = widgets.IntSlider(value=4, min=2, max=8, step=2, description="P (ranks)", **wide)
    m = widgets.IntSlider(value=8, min=8, max=32, step=2, description="m (microbatches)", **wide)
    f = widgets.FloatSlider(value=1.0, min=0.5, max=3.0, step=0.25, description="F", **wide)
    b = widgets.FloatSlider(value=2.0, min=0.5, max=4.0, step=0.25, description="B", **wide)
    w = widgets.FloatSlider(value=0.5, min=0.1, max=0.9, step=0.05, description="W ÷ B", **wide)
    fb = widgets.FloatSlider(
        value=1.0, min=0.5, max=1.0, step=0.05, description="F&B ÷ (F + B)", **wide
    )

    def draw(_: object = None) -> None:
        if m.min != 2 * p.value:  # at least one microbatch per stage
            m.min = 2 * p.value
        out.clear_output(wait=True)
        with out:
            beside(
                p.value,
                m.value,
                t_f=f.value,
                t_b=b.value,
                t_w=w.value * b.value,
                t_fb=fb.value * (f.value + b.value),
            ).show()

    for control in (p, m, f, b, w, fb):
        control.observe(draw, names="value")
    draw()
    return widgets.VBox(
        [widgets.HBox([p, m]), widgets.HBox([f, b]), widgets.HBox([w, fb]), out],
        layout={"width": "100%"},
    )
