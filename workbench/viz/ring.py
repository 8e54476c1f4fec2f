"""The ring all-reduce, step by step, from what the ranks recorded (not from a textbook animation).

For one all-reduce (a `seq` of the dp group) the chart shows, after each of the 2(n−1) ring steps,
how many ranks' contributions each chunk on each rank holds (1/n … n/n), with arrows for the chunks
that moved at that step: reduce-scatter steps add what arrives, all-gather steps copy it. A slider
walks through the steps. Everything comes from the `ring_step` spans' args: phase, send_chunk,
recv_chunk, peer and recv_peer.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.run import Run


def ring_all_reduces(run: Run) -> pd.DataFrame:
    """One row per recorded ring all-reduce: step, seq, bytes, duration."""
    ev = run.events
    if ev.empty or "ring_step" not in set(ev.cat):
        return pd.DataFrame(columns=["step", "seq", "chunks", "bytes", "ring_steps"])
    ring = ev[ev.cat == "ring_step"]
    return (ring[ring["rank"] == ring["rank"].min()].groupby(["step", "seq"])
            .agg(chunks=("chunks", "first"), bytes=("bytes", "sum"), ring_steps=("ring_step", "count"))
            .reset_index())


def replay(steps: pd.DataFrame, n: int) -> list[list[list[frozenset]]]:
    """states[k][rank][chunk] = the set of ranks whose data the chunk holds after ring step k (k=0:
    before the first step), replayed from the recorded spans of one all-reduce."""
    state = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    states = [state]
    for k in sorted(steps.ring_step.unique()):
        at_k = steps[steps.ring_step == k]
        new = [row[:] for row in state]
        for _, s in at_k.iterrows():
            r, c, src = int(s["rank"]), int(s.recv_chunk), int(s.recv_peer)
            incoming = state[src][c]
            new[r][c] = state[r][c] | incoming if s.phase == "reduce_scatter" else incoming
        state = new
        states.append(state)
    return states


def ring_steps(run: Run, step: int | None = None, seq: int | None = None) -> go.Figure:
    ev = run.events
    ring = ev[ev.cat == "ring_step"] if not ev.empty else ev
    if ring.empty:
        return go.Figure(layout={"title": "no ring all-reduce in this run (launch with allreduce='ring')"})
    step = int(ring.step.max()) if step is None else step
    at = ring[ring.step == step]
    seq = int(at.seq.min()) if seq is None else seq
    one = at[at.seq == seq]
    ranks = sorted(int(r) for r in one["rank"].unique())
    n = int(one.chunks.iloc[0])
    index = {r: i for i, r in enumerate(ranks)}
    one = one.assign(rank=one["rank"].map(index), recv_peer=one.recv_peer.map(index))
    states = replay(one, n)
    fig = go.Figure()
    labels = []
    annotations_per_step = []
    moved_bytes = [0]
    for k, state in enumerate(states):
        z = [[len(state[r][c]) / n for c in range(n)] for r in range(n)]
        text = [[f"{len(state[r][c])}/{n}" for c in range(n)] for r in range(n)]
        fig.add_trace(go.Heatmap(z=z, text=text, texttemplate="%{text}", zmin=0, zmax=1, colorscale="Blues",
                                 x=[f"chunk {c}" for c in range(n)], y=[f"rank {ranks[r]}" for r in range(n)],
                                 showscale=False, visible=(k == 0),
                                 hovertemplate="%{y}, %{x}: %{text} contributions<extra></extra>"))
        notes = []
        if k == 0:
            labels.append("start")
        else:
            moved = one[one.ring_step == sorted(one.ring_step.unique())[k - 1]]
            phase = moved.phase.iloc[0]
            labels.append(f"{k}: {phase.replace('_', '-')}")
            moved_bytes.append(int(moved.bytes.max()))
            for _, s in moved.iterrows():
                dst, src, c = int(s["rank"]), int(s.recv_peer), int(s.recv_chunk)
                notes.append({"x": f"chunk {c}", "y": f"rank {ranks[dst]}", "ax": f"chunk {c}",
                              "ay": f"rank {ranks[src]}", "xref": "x", "yref": "y", "axref": "x", "ayref": "y",
                              "showarrow": True, "arrowhead": 3, "arrowwidth": 2,
                              "arrowcolor": "#E45756" if phase == "reduce_scatter" else "#54A24B", "text": ""})
        annotations_per_step.append(notes)
    slider_steps = []
    for k, label in enumerate(labels):
        visible = [i == k for i in range(len(states))]
        title = (f"ring all-reduce (step {step}, seq {seq}, {n} ranks) — after {label}, "
                 f"each rank sent {moved_bytes[k]} B"
                 if k else f"ring all-reduce (step {step}, seq {seq}, {n} ranks) — before the first step")
        slider_steps.append({"label": label, "method": "update",
                             "args": [{"visible": visible}, {"annotations": annotations_per_step[k], "title": title}]})
    fig.update_layout(
        title=slider_steps[0]["args"][1]["title"], height=260 + 40 * n,
        sliders=[{"active": 0, "steps": slider_steps, "currentvalue": {"prefix": "ring step "}}],
        yaxis={"autorange": "reversed"},
    )
    return fig
