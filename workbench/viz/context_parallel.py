"""Context parallelism's charts, from a run's traces (parallel/context_parallel.py records them):

    ring_replay(run)          the causal score matrix cut into chunk blocks: each block coloured by the rank
                              that computes it, labelled with the ring step at which its K/V arrive there
    attention_work(runs)      each rank's unmasked query-key pairs per layer, recorded beside the formula, and
                              its share of the attention work (balance: head-tail against none)
    activations_vs_cp(runs)   peak activation bytes per rank, measured and predicted, against cp

The ring step of a block comes from the recorded `cp_ring` spans (forward, first layer, first step): at
step i a rank computes on the K/V block it holds (`block_of`) while passing it on; the last block, which it
computes after the last transfer, is the one that arrived then.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from workbench.analysis.run import Run
from workbench.predict.formulas.context_parallel import owned_chunks, unmasked_pairs_per_rank
from workbench.viz.palette import SERIES_COLORS


def _cp(run: Run) -> tuple[int, str, int]:
    c = run.config
    return c["cp"], c.get("cp_balance", "head-tail"), c["model"]["seq_len"]


def ring_blocks(run: Run) -> pd.DataFrame:
    """One row per (query chunk, key chunk) block below the diagonal: the rank computing it (the query's
    owner), the K/V owner, the forward ring step (1 = its own K/V) and whether it was skipped whole."""
    cp, balance, _ = _cp(run)
    n = 2 * cp if balance == "head-tail" else cp
    owner = {c: r for r in range(cp) for c in owned_chunks(r, cp, balance)}
    ev = run.events
    spans = (
        ev[(ev.cat == "cp_ring") & (ev.phase == "forward")]
        if "cp_ring" in set(ev.cat)
        else ev.iloc[:0]
    )
    first = (
        spans[(spans.step == spans.step.min()) & (spans.layer == spans.layer.iloc[0])]
        if len(spans)
        else spans
    )
    step_of = {(int(s["rank"]), int(s.block_of)): int(s.ring_step) for _, s in first.iterrows()}
    # not recorded: the ring's last block, computed after its last hop; all-gathered K/V all arrive at once
    last = cp if run.config.get("cp_rotate", "ring") == "ring" else 1
    rows = []
    for q in range(n):
        for k in range(q + 1):
            rank, kv = owner[q], owner[k]
            step = step_of.get((rank, kv), last)
            rows.append(
                {
                    "query chunk": q,
                    "key chunk": k,
                    "rank": rank,
                    "kv of rank": kv,
                    "ring step": step,
                }
            )
    return pd.DataFrame(rows)


def ring_replay(run: Run, height: int = 420) -> go.Figure:
    """The causal triangle of chunk blocks, each coloured by the rank that computes it, with its ring step."""
    cp, balance, seq = _cp(run)
    blocks = ring_blocks(run)
    n = 2 * cp if balance == "head-tail" else cp
    fig = go.Figure()
    for rank in range(cp):
        mine = blocks[blocks["rank"] == rank]
        fig.add_trace(
            go.Scatter(
                x=mine["key chunk"],
                y=mine["query chunk"],
                mode="markers+text",
                name=f"rank {rank}",
                text=[f"step {s}" for s in mine["ring step"]],
                textfont={"color": "white", "size": 10},
                marker={
                    "symbol": "square",
                    "size": max(18, 300 // n),
                    "color": SERIES_COLORS[rank % len(SERIES_COLORS)],
                },
                hovertext=[
                    f"queries of chunk {q} (rank {rank}) × keys of chunk {k} (rank {kv}): ring step {s}"
                    for q, k, kv, s in zip(
                        mine["query chunk"],
                        mine["key chunk"],
                        mine["kv of rank"],
                        mine["ring step"],
                        strict=True,
                    )
                ],
                hoverinfo="text",
            )
        )
    fig.update_xaxes(
        title_text=f"key chunk ({seq // n} tokens each)", dtick=1, range=[-0.6, n - 0.4]
    )
    fig.update_yaxes(title_text="query chunk", dtick=1, range=[n - 0.4, -0.6])
    fig.update_layout(
        height=height,
        title=f"ring attention, cp = {cp}, balance '{balance}': the causal blocks "
        "and who computes them (diagonal blocks are half masked)",
    )
    return fig


def attention_work(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run and rank: unmasked query-key pairs per layer as recorded, the formula's, and the rank's share."""
    rows = []
    for name, run in runs.items():
        cp, balance, seq = _cp(run)
        predicted = unmasked_pairs_per_rank(seq, cp, balance)
        for trace in run.traces:
            info = trace["workbench"]
            pairs = next(iter(info["cp_pairs"].values()))
            rows.append(
                {
                    "run": name,
                    "rank": info["cp"],
                    "balance": balance,
                    "pairs per layer (recorded)": pairs,
                    "pairs per layer (formula)": predicted[info["cp"]],
                    "share of the work": pairs / (seq * (seq + 1) / 2),
                }
            )
    return (
        pd.DataFrame(rows)
        .drop_duplicates(["run", "rank"])
        .sort_values(["run", "rank"])
        .reset_index(drop=True)
    )


def activations_vs_cp(runs: dict[str, Run]) -> pd.DataFrame:
    """Per run: cp, and rank 0's peak activation bytes, measured and predicted."""
    rows = []
    for name, run in runs.items():
        r0 = run.summary["ranks"][0]
        rows.append(
            {
                "run": name,
                "cp": run.config.get("cp", 1),
                "measured (kB)": r0["peak_bytes"]["activation"] / 1e3,
                "predicted (kB)": r0["predicted_bytes"]["activation"] / 1e3,
            }
        )
    return pd.DataFrame(rows).sort_values("cp").reset_index(drop=True)
