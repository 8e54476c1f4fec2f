"""The rank grid as a picture (config/grid.py's layout: rank = ((pp·dp + dp)·cp + cp)·tp + tp).

    rank_layout(RankGrid(dp=2, tp=2, pp=2))          the 3D layout: a row per data replica, a panel per stage
    rank_layout(RankGrid(dp=2, cp=2, tp=2, pp=1))    with context parallelism: cp places beside the tp shards

Each marker is a rank; its colour is its innermost group (tp, or cp where there is no tp), so the groups
that talk in every layer read as neighbours. No run needed: plain arithmetic on the grid.
"""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from workbench.config.grid import RankGrid


def layout_table(grid: RankGrid) -> pd.DataFrame:
    """One row per rank: its coordinates and the members of each of its groups."""
    rows = []
    for r in range(grid.world_size):
        c = grid.coords(r)
        groups = {
            f"{axis} group": grid.group_ranks(axis, r)
            for axis in ("tp", "cp", "dp", "pp")
            if getattr(grid, axis) > 1
        }
        if grid.cp > 1:
            groups["dp_cp group (gradients)"] = grid.group_ranks("dp_cp", r)
        rows.append({"rank": r, **c, **groups})
    return pd.DataFrame(rows).set_index("rank")


def rank_layout(grid: RankGrid, height: int = 380) -> go.Figure:
    """Every rank in its place: x the position inside a replica (cp, then tp), y the data replica, one panel
    per pipeline stage; coloured by its tp group (or cp group without tp)."""
    inner = "tp" if grid.tp > 1 or grid.cp == 1 else "cp"
    rows = []
    for r in range(grid.world_size):
        c = grid.coords(r)
        where = (
            f"cp {c['cp']} · tp {c['tp']}"
            if grid.cp > 1 and grid.tp > 1
            else f"cp {c['cp']}"
            if grid.cp > 1
            else f"tp {c['tp']}"
        )
        rows.append(
            {
                "rank": r,
                "pipeline stage": f"stage {c['pp']}",
                "data replica": f"replica {c['dp']}",
                "place": where,
                "order": c["cp"] * grid.tp + c["tp"],
                "group": f"{inner} group {grid.group_ranks(inner, r)}",
            }
        )
    df = pd.DataFrame(rows).sort_values(["order", "rank"])
    what = "a tp group" if inner == "tp" else "a cp group (the sequence's ring)"
    fig = px.scatter(
        df,
        x="place",
        y="data replica",
        facet_col="pipeline stage",
        text="rank",
        color="group",
        title=f"one colour per {what}; a column a dp group; the same cell across stages a pp group"
        + (" — gradients reduce over dp × cp" if grid.cp > 1 else ""),
    )
    # "stage 0", not "pipeline stage=…"
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    fig.update_traces(marker_size=40, textfont_color="white")
    fig.update_xaxes(
        categoryorder="array", categoryarray=list(dict.fromkeys(df.place)), title_text=""
    )
    fig.update_layout(height=height, legend_title_text="")
    return fig
