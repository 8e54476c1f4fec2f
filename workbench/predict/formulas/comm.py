"""Communication and the pipeline bubble per step. Plain arithmetic, no torch."""

from __future__ import annotations

from workbench.config import ModelConfig


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of a pipeline step with equal stage times: (p−1)/(v·m + p−1); v=1 is GPipe/1F1B."""
    return (p - 1) / (v * m + p - 1)


def dp_bytes_per_step(params: float, dp: int, zero: int = 0, grad_bytes: int = 4) -> float:
    """Gradient-synchronisation bytes each rank sends per step (ring algorithm): 2Ψ·(n−1)/n values
    for plain DP and ZeRO-1/2, 3Ψ·(n−1)/n for ZeRO-3 (parameters gathered twice)."""
    factor = 3 if zero >= 3 else 2
    return factor * (dp - 1) / dp * params * grad_bytes if dp > 1 else 0.0


def tp_comm_bytes_per_step(
    cfg: ModelConfig,
    micro_batch: int,
    tp: int,
    *,
    sequence_parallel: bool = False,
    microbatches: int = 1,
    layers: int | None = None,
    first: bool = True,
    last: bool = True,
    bytes_per_value: int = 4,
    recompute: str = "none",
    grad_bytes: int = 4,
    positions: int | None = None,
) -> dict[str, float]:
    """Bytes (S, the full buffer, as nccl-tests counts) of the tensor-parallel collectives of one
    training step on one rank holding `layers` blocks (all by default), the embedding if `first`, the
    head and loss if `last` — from the operators our layers use:

    without sequence parallelism, each block: g after attn.proj and mlp.proj (forward), f before qkv
    and fc (backward) — 4 all-reduces of b·s·h; the embedding's g and the head's f one more each.
    With sequence parallelism they become reduce-scatters and all-gathers of the same b·s·h buffers,
    and each column layer gathers its input again in backward instead of keeping it (+1 all-gather);
    the gradients left partial (layer norms, positions, row biases) are all-reduced once per step, at
    `grad_bytes` per value (fp32, or a 16-bit run's 16-bit gradients).
    The loss adds three all-reduces of one value per token; the gradient norm one scalar per step.
    Full recomputation runs each block's forward twice, so its forward collectives twice. Under context
    parallelism `cfg.seq_len` is each rank's s/cp tokens and `positions` the position table's rows (s).
    """
    if tp == 1:
        return {}
    s, b, h, w, m = cfg.seq_len, micro_batch, cfg.hidden, bytes_per_value, microbatches
    L = cfg.layers if layers is None else layers
    full = b * s * h * w
    loss = 3 * b * s * 4 if last else 0
    again = 2 * L if recompute == "full" else 0  # the forward's collectives of every block, rerun
    if not sequence_parallel:
        return {"all_reduce": m * ((4 * L + again + first + last) * full + loss) + 4}
    partial = L * 6 * h + ((positions or s) * h if first else 0) + (2 * h if last else 0)
    return {
        "all_gather": m * (6 * L + again + first + 2 * last) * full,
        "reduce_scatter": m * (4 * L + again + first + last) * full,
        "all_reduce": m * loss + grad_bytes * partial + 4,
    }


# ---- a run's predictions, from its resolved config (what summary.json puts beside the measurement) ----


def onebit_bytes_per_step(params: float, dp: int) -> float:
    """1-bit Adam after its warm-up: the momentum's signs (Ψ/8 bytes) and n fp32 scales, in an all-to-all
    and an all-gather: 2(n−1)/n · (Ψ/8 + 4n) bytes each rank sends — 1/32 of the fp32 all-reduce, plus
    the scales."""
    return 2 * (dp - 1) / dp * (params / 8 + 4 * dp) if dp > 1 else 0.0


def dp_link_bytes(
    nbytes: float, dp: int, ranks_per_node: int, hierarchical: bool
) -> dict[str, float]:
    """Bytes each rank sends per link class for an all-reduce of `nbytes` over dp ranks packed on machines
    of `ranks_per_node` (K) — m = dp/K machines. A flat ring that spans machines waits, at every one of
    its steps, on the pair that crosses: all its 2(n−1)/n · S go at the inter-machine pace. Hierarchical:
    2(K−1)/K · S inside the machine (reduce-scatter + all-gather), 2(m−1)/m · S/K across it."""
    k = min(ranks_per_node, dp) if ranks_per_node > 0 else dp
    m = max(dp // k, 1)
    if dp <= 1:
        return {"intra": 0.0, "inter": 0.0}
    if m == 1:
        return {"intra": 2 * (dp - 1) / dp * nbytes, "inter": 0.0}
    if not hierarchical:
        return {"intra": 0.0, "inter": 2 * (dp - 1) / dp * nbytes}
    return {"intra": 2 * (k - 1) / k * nbytes, "inter": 2 * (m - 1) / m * nbytes / k}


def node_link_bytes(nbytes: float, dp: int, ranks_per_node: int, hierarchical: bool) -> float:
    """Bytes one machine's link carries each way for an all-reduce of `nbytes` over dp ranks packed on
    machines of K = `ranks_per_node`, where the K ranks share that one link (a machine with one network
    card; a local cluster's node). A flat ring enters and leaves each machine once: one rank's 2(n−1)/n · S
    each way. Hierarchical: the machine's K inter-machine all-reduces, of S/K each, all cross it at once:
    K · 2(m−1)/m · S/K = 2(m−1)/m · S. Per rank the hierarchical sends K times fewer bytes across
    (dp_link_bytes: what a link per rank carries, as with a network card per GPU); per shared link the
    ratio is (n−1)/n · m/(m−1) — 1.5 for 2 machines of 2."""
    k = min(ranks_per_node, dp) if ranks_per_node > 0 else dp
    m = max(dp // k, 1)
    if dp <= 1 or m == 1:
        return 0.0
    return 2 * (m - 1) / m * nbytes if hierarchical else 2 * (dp - 1) / dp * nbytes
