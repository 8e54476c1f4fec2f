"""Tensor-parallel shards drawn from the shapes the ranks really held.

Each panel is one weight matrix of block 0 (plus the embedding and the head) in its full (out × in)
shape; each tp rank's part is a coloured rectangle labelled with the local shape that rank recorded.
Column-parallel layers are cut across their output rows (qkv in three stripes: q, k and v, each
split by heads), row-parallel layers across their input columns, the embedding and the head by
vocabulary.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.analysis.run import Run
from workbench.predict.formulas.run import run_model
from workbench.viz.palette import SERIES_COLORS

RANK_COLORS = SERIES_COLORS

PANELS = [  # (parameter, title, kind)
    ("wte.weight", "embedding (vocab-parallel)", "rows"),
    ("blocks.0.attn.qkv.weight", "attn.qkv (column: q|k|v by heads)", "qkv"),
    ("blocks.0.attn.proj.weight", "attn.proj (row)", "cols"),
    ("blocks.0.mlp.fc.weight", "mlp.fc (column; SwiGLU: gate|up)", "rows"),
    ("blocks.0.mlp.proj.weight", "mlp.proj (row)", "cols"),
    ("head.weight", "head (column, vocab)", "rows"),
]


def shard_table(run: Run) -> pd.DataFrame:
    """One row per (rank, parameter): the local shape each rank recorded."""
    rows = []
    for t in run.traces:
        info = t["workbench"]
        for name, shape in info.get("param_shapes", {}).items():
            rows.append(
                {
                    "rank": info["rank"],
                    "tp": info["tp"],
                    "parameter": name,
                    "shape": tuple(shape),
                    "numel": int(pd.Series(shape).prod()) if shape else 1,
                }
            )
    return pd.DataFrame(rows)


def tp_shards(run: Run) -> go.Figure:
    table = shard_table(run)
    tp_size = int(run.config.get("tp", 1))
    model = run_model(run.config)
    h, v, f = model.hidden, model.vocab_size, model.inner
    full = {
        "wte.weight": (v, h),
        "blocks.0.attn.qkv.weight": (model.qkv_width, h),
        "blocks.0.attn.proj.weight": (h, h),
        "blocks.0.mlp.fc.weight": (model.mlp_in_width, h),
        "blocks.0.mlp.proj.weight": (h, f),
        "head.weight": (v, h),
    }
    # the fused projections' parts, each split by tp: q | k | v (k, v narrower with grouped queries), gate | up
    sections = {
        "blocks.0.attn.qkv.weight": (h, model.kv_dim, model.kv_dim),
        "blocks.0.mlp.fc.weight": (f, f) if model.mlp == "swiglu" else (f,),
    }
    # one rank per tp index (dp replicas hold the same shards)
    reps = table[table["rank"].isin(table.groupby("tp")["rank"].min())]
    # two rows of three: six titles side by side overlapped at a notebook's width
    fig = make_subplots(
        rows=2,
        cols=3,
        subplot_titles=[p[1] for p in PANELS],
        horizontal_spacing=0.08,
        vertical_spacing=0.2,
    )
    for i, (name, _, kind) in enumerate(PANELS):
        at = {"row": i // 3 + 1, "col": i % 3 + 1}
        out_f, in_f = full[name]
        for _, row in reps[reps.parameter == name].iterrows():
            j = int(row.tp)
            color = RANK_COLORS[j % len(RANK_COLORS)]
            for x0, x1, y0, y1 in _regions(
                kind, j, tp_size, out_f, in_f, sections=sections.get(name)
            ):
                fig.add_shape(
                    type="rect",
                    x0=x0,
                    x1=x1,
                    y0=y0,
                    y1=y1,
                    fillcolor=color,
                    opacity=0.75,
                    line={"color": "white", "width": 1},
                    **at,
                )
            label = f"tp {j}<br>{row['shape'][0]}×{row['shape'][1]}"
            x0, x1, y0, y1 = _regions(kind, j, tp_size, out_f, in_f, sections=sections.get(name))[0]
            # qkv stripes are too thin to write in: its labels show on hover only
            fig.add_trace(
                go.Scatter(
                    x=[(x0 + x1) / 2],
                    y=[(y0 + y1) / 2],
                    mode="markers" if kind == "qkv" else "text",
                    text=[label],
                    marker={"size": 1, "color": color},
                    showlegend=False,
                    textfont={"color": "white"},  # the trace's colour would be the fill's
                    hovertemplate=f"{name}: {label}<extra></extra>",
                ),
                **at,
            )
        fig.update_xaxes(range=[0, in_f], title_text=f"in features ({in_f})", showgrid=False, **at)
        fig.update_yaxes(
            range=[out_f, 0], title_text=f"out features ({out_f})", showgrid=False, **at
        )
    fig.update_layout(
        title=f"weight shards on tp={tp_size} ranks (block 0, embedding, head), from the recorded "
        f"shapes",
        height=700,
    )
    return fig


def _regions(
    kind: str, j: int, t: int, out_f: int, in_f: int, *, sections: tuple[int, ...] | None = None
) -> list[tuple[float, float, float, float]]:
    """(x0, x1, y0, y1) rectangles that tp rank j owns in an (out × in) matrix: its t-th of the input columns
    (row-parallel), or of each of the output `sections` (column-parallel; one section: all the rows)."""
    if kind == "cols":
        per = in_f / t
        return [(j * per, (j + 1) * per, 0, out_f)]
    out: list[tuple[float, float, float, float]] = []
    start = 0.0
    for size in sections or (out_f,):
        per = size / t
        out.append((0, in_f, start + j * per, start + (j + 1) * per))
        start += size
    return out
