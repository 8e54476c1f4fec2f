"""Our ring collectives, step by step, from what the ranks recorded (not from a textbook animation).

For one ring collective (a `seq` of its group: an all-reduce — allreduce='ring' —, a reduce-scatter or an
all-gather — ZeRO-1 with allreduce='ring' —, or a broadcast) the chart shows, after each ring step, what
each chunk on each rank holds: for the reducing ops how many ranks' contributions (1/n … n/n), for the
copying ones whether the chunk has arrived. Arrows mark the chunks that moved at that step (red: added,
green: copied), a slider walks through the steps, and the title puts the bytes each rank has sent so far
beside the formula for the whole operation: 2(n−1)/n·S for an all-reduce, (n−1)/n·S for a reduce-scatter
or all-gather, S for a broadcast. Everything comes from the `ring_step` spans' args (phase, send_chunk,
recv_chunk, peer, recv_peer, bytes) and the collective's own record (op, bytes, peer: a broadcast's source).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.run import Run

#: the bytes each rank sends for a ring collective of S bytes over n ranks (the bus-bandwidth factor)
SENT = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def ring_collectives(run: Run) -> pd.DataFrame:
    """One row per recorded ring collective: step, group, seq, op, bytes (S), ranks, ring_steps."""
    ev = run.events
    cols = ["step", "group", "seq", "op", "bytes", "ranks", "ring_steps"]
    if ev.empty or "ring_step" not in set(ev.cat):
        return pd.DataFrame(columns=cols)
    ops = ev[(ev.cat == "collective") & (ev.algorithm == "ring")]
    first = ops[ops["rank"] == ops["rank"].min()]
    ring = ev[ev.cat == "ring_step"]
    # the steps of the whole collective, over every rank (a pipelined broadcast's source sends in fewer
    # of them than the chain takes): what ring_steps() draws
    counts = ring.groupby(["step", "group", "seq"]).ring_step.nunique().rename("ring_steps")
    out = first[["step", "group", "seq", "op", "bytes"]].merge(
        counts.reset_index(), on=["step", "group", "seq"]
    )
    out["ranks"] = [
        ops[(ops.step == r.step) & (ops.group == r.group) & (ops.seq == r.seq)]["rank"].nunique()
        for r in out.itertuples()
    ]
    return out[cols].astype({"step": int, "seq": int, "bytes": int}).reset_index(drop=True)


def ring_all_reduces(run: Run) -> pd.DataFrame:
    """The ring all-reduces among `ring_collectives`."""
    rows = ring_collectives(run)
    return rows[rows.op == "all_reduce"].reset_index(drop=True)


def initial_state(op: str, n: int, source: int = 0) -> list[list[frozenset]]:
    """`state[rank][chunk]` before the first step: the ranks whose data the chunk holds."""
    if op == "all_gather":
        return [[frozenset({r}) if c == r else frozenset() for c in range(n)] for r in range(n)]
    if op == "broadcast":
        return [
            [frozenset({source}) if r == source else frozenset() for _ in range(n)]
            for r in range(n)
        ]
    return [[frozenset({r}) for _ in range(n)] for r in range(n)]


def replay(
    steps: pd.DataFrame, n: int, op: str = "all_reduce", source: int = 0
) -> list[list[list[frozenset]]]:
    """`states[k][rank][chunk]` after ring step k (k=0: before the first step), replayed from the recorded
    spans of one collective: a reduce-scatter step adds what arrives, every other step copies it."""
    state = initial_state(op, n, source)
    states = [state]
    for k in sorted(steps.ring_step.unique()):
        new = [row[:] for row in state]
        for _, s in steps[(steps.ring_step == k) & steps.recv_chunk.notna()].iterrows():
            r, c, src = int(s["rank"]), int(s.recv_chunk), int(s.recv_peer)
            new[r][c] = (
                state[r][c] | state[src][c] if s.phase == "reduce_scatter" else state[src][c]
            )
        state = new
        states.append(state)
    return states


def ring_steps(
    run: Run, step: int | None = None, seq: int | None = None, op: str | None = None
) -> go.Figure:
    """The slider chart of one ring collective (default: the first of `op`, or of any op, in the last step)."""
    table = ring_collectives(run)
    if op is not None:
        table = table[table.op == op]
    if table.empty:
        return go.Figure(
            layout={
                "title": "no ring collective in this run (allreduce='ring'; ZeRO-1 for "
                "reduce-scatter and all-gather)"
            }
        )
    step = int(table.step.max()) if step is None else step
    row = table[(table.step == step) & ((table.seq == seq) if seq is not None else True)].iloc[0]
    ev = run.events
    one = ev[
        (ev.cat == "ring_step") & (ev.step == step) & (ev.group == row.group) & (ev.seq == row.seq)
    ]
    ranks = sorted(int(r) for r in one["rank"].unique())
    index = {r: i for i, r in enumerate(ranks)}
    one = one.assign(rank=one["rank"].map(index), recv_peer=one.recv_peer.map(index))
    n, kind = len(ranks), str(row.op)
    record = ev[
        (ev.cat == "collective") & (ev.step == step) & (ev.group == row.group) & (ev.seq == row.seq)
    ]
    source = (
        index.get(int(record.peer.dropna().iloc[0]), 0)
        if kind == "broadcast" and record.peer.notna().any()
        else 0
    )
    states = replay(one, n, kind, source)
    return _figure(
        one, states, ranks, kind, size=int(row.bytes), where=f"step {step}, seq {int(row.seq)}"
    )


def _figure(
    one: pd.DataFrame, states: list, ranks: list[int], op: str, *, size: int, where: str
) -> go.Figure:
    n, reducing = len(ranks), op in ("all_reduce", "reduce_scatter")
    fig = go.Figure()
    slider_steps: list[dict[str, Any]] = []
    sent = pd.Series(0, index=range(n))
    ring_ks = sorted(one.ring_step.unique())
    name = f"ring {op.replace('_', '-')} ({where}, {n} ranks, S = {size} B)"
    formula = SENT[op](n) * size
    for k, state in enumerate(states):
        z = [
            [(len(state[r][c]) / n if reducing else float(bool(state[r][c]))) for c in range(n)]
            for r in range(n)
        ]
        text = [
            [
                (f"{len(state[r][c])}/{n}" if reducing else ("✓" if state[r][c] else ""))
                for c in range(n)
            ]
            for r in range(n)
        ]
        fig.add_trace(
            go.Heatmap(
                z=z,
                text=text,
                texttemplate="%{text}",
                zmin=0,
                zmax=1,
                colorscale="Blues",
                x=[f"chunk {c}" for c in range(n)],
                y=[f"rank {r}" for r in ranks],
                showscale=False,
                visible=(k == 0),
                hovertemplate="%{y}, %{x}: %{text}<extra></extra>",
            )
        )
        notes, label = [], "start"
        if k:
            moved = one[(one.ring_step == ring_ks[k - 1]) & one.recv_chunk.notna()]
            sent = sent.add(
                one[one.ring_step == ring_ks[k - 1]].groupby("rank").bytes.sum(), fill_value=0
            )
            label = f"{k}: {moved.phase.iloc[0].replace('_', '-')}" if len(moved) else str(k)
            notes = [
                {
                    "x": f"chunk {int(s.recv_chunk)}",
                    "y": f"rank {ranks[int(s['rank'])]}",
                    "ax": f"chunk {int(s.recv_chunk)}",
                    "ay": f"rank {ranks[int(s.recv_peer)]}",
                    "xref": "x",
                    "yref": "y",
                    "axref": "x",
                    "ayref": "y",
                    "showarrow": True,
                    "arrowhead": 3,
                    "arrowwidth": 2,
                    "standoff": 14,
                    "startstandoff": 14,  # from cell edge to cell edge: the labels stay readable
                    "arrowcolor": "#E45756" if s.phase == "reduce_scatter" else "#54A24B",
                    "text": "",
                }
                for _, s in moved.iterrows()
            ]
        # two lines: one ran past a notebook's width and was clipped
        title = (
            f"{name}<br>after {label}: the busiest rank has sent {int(sent.max())} B; the whole operation: "
            f"{formula:.0f} B each (formula)"
            if k
            else f"{name}<br>before the first step"
        )
        slider_steps.append(
            {
                "label": label,
                "method": "update",
                "args": [
                    {"visible": [i == k for i in range(len(states))]},
                    {"annotations": notes, "title": {"text": title}},
                ],
            }
        )
    # the slider sets {"title": {"text": …}}: plotly.js no longer accepts a bare string there (the title vanished)
    fig.update_layout(
        title=slider_steps[0]["args"][1]["title"],
        height=280 + 40 * n,
        margin={"t": 90},
        yaxis={"autorange": "reversed", "title": "rank"},
        xaxis_title="chunk of the buffer",
        sliders=[{"active": 0, "steps": slider_steps, "currentvalue": {"prefix": "ring step "}}],
    )
    return fig
