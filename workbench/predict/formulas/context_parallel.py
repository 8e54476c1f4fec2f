"""Context parallelism's communication and work (parallel/ring_attention.py, parallel/context_parallel.py).
Plain arithmetic, no torch.

Sources: Liu, Zaharia and Abbeel 2023 ("Ring Attention with Blockwise Transformers") for the ring;
Megatron-LM's context parallelism and torch.distributed.tensor.experimental.context_parallel for the
head-tail (zig-zag) balance and the all-gather rotation. Symbols: s sequence, b microbatch, h hidden,
t tensor-parallel degree, cp the context-parallel degree, w bytes per activation value; kv_width is K's
(and V's) width per token, h without grouped-query attention.
"""

from __future__ import annotations


def kv_block_bytes(
    seq_len: int, micro_batch: int, kv_width: int, cp: int, *, tp: int = 1, width: int = 4
) -> float:
    """One rank's K and V for one layer: 2·b·(s/cp)·(kv_width/t) values of the activations' width — kv_width
    the model's `kv_dim`: h, or with grouped-query attention kv_heads·head_dim (the ring carries the K/V
    heads, not the query heads they serve)."""
    return 2 * micro_batch * seq_len / cp * kv_width / tp * width


def ring_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    kv_width: int,
    cp: int,
    *,
    tp: int = 1,
    width: int = 4,
    recompute: bool = False,
) -> dict[str, float]:
    """Bytes one rank sends (and receives) per attention layer and microbatch, rotating K/V round the ring:

        forward   (cp − 1) K/V blocks: 2·(cp − 1)/cp·s·b·kv_width/t values — twice with recomputation (the rerun
                  of the attention core rotates them again)
        backward  (cp − 1) K/V blocks with their dK/dV beside them, and one last hop of dK/dV home: the
                  dK/dV travel in fp32 (4 bytes, accumulated on every rank they pass)

    so backward moves about twice forward's bytes (its K/V again, and the gradients)."""
    kv = kv_block_bytes(seq_len, micro_batch, kv_width, cp, tp=tp, width=width)
    dkv = kv_block_bytes(seq_len, micro_batch, kv_width, cp, tp=tp, width=4)
    forward = (cp - 1) * kv * (2 if recompute else 1)
    return {"forward": forward, "backward": (cp - 1) * (kv + dkv) + dkv}


def cp_comm_bytes_per_step(
    seq_len: int,
    micro_batch: int,
    kv_width: int,
    cp: int,
    *,
    layers: int,
    microbatches: int = 1,
    tp: int = 1,
    width: int = 4,
    rotate: str = "ring",
    recompute: bool = False,
) -> dict[str, float]:
    """Bytes per step by operation on the `cp` group for a rank holding `layers` blocks, as the trace counts
    them (`send` and `recv` for the ring; the all-gather's whole output and the reduce-scatter's whole input
    — S as nccl-tests counts it — for rotate='allgather')."""
    if cp == 1:
        return {}
    calls = layers * microbatches
    if rotate == "ring":
        per = ring_bytes_per_layer(
            seq_len, micro_batch, kv_width, cp, tp=tp, width=width, recompute=recompute
        )
        moved = calls * (per["forward"] + per["backward"])
        return {"send": moved, "recv": moved}
    kv = kv_block_bytes(seq_len, micro_batch, kv_width, cp, tp=tp, width=width)
    dkv = kv_block_bytes(seq_len, micro_batch, kv_width, cp, tp=tp, width=4)
    return {
        "all_gather": calls * cp * kv * (2 if recompute else 1),
        "reduce_scatter": calls * cp * dkv,
    }


def unmasked_pairs_per_rank(seq_len: int, cp: int, balance: str = "head-tail") -> list[int]:
    """The causal query-key pairs (key ≤ query) each rank computes per sequence and head: its share of the
    attention work. Head-tail gives rank r chunks r and 2cp − 1 − r of 2·cp, so every rank gets the same;
    a contiguous split gives rank r the r-th cp-th, whose queries see r + ½ blocks: the last rank does
    (2cp − 1) times the first's."""
    n = 2 * cp if balance == "head-tail" else cp
    size = seq_len // n

    def chunk_pairs(q: int, k: int) -> int:  # pairs between query chunk q and key chunk k
        if k < q:
            return size * size
        return size * (size + 1) // 2 if k == q else 0

    return [
        sum(chunk_pairs(q, k) for q in owned_chunks(r, cp, balance) for k in range(n))
        for r in range(cp)
    ]


def owned_chunks(rank: int, cp: int, balance: str = "head-tail") -> list[int]:
    """The sequence chunks a rank holds: r and 2cp − 1 − r of 2·cp (head-tail), or r of cp (none) — the
    arithmetic of parallel/ring_attention.chunks_of, without torch, for the charts."""
    return [rank, 2 * cp - 1 - rank] if balance == "head-tail" else [rank]
