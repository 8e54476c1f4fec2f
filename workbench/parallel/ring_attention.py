"""Context parallelism's attention as a ring (Liu, Zaharia and Abbeel 2023, "Ring Attention"; the zig-zag
balance of Megatron-LM's and torch's context parallelism).

**What is sharded.** The sequence: each of the cp ranks of a context-parallel group holds the queries,
keys and values of its own tokens. `balance="head-tail"` (the default) cuts the sequence into 2·cp
chunks and gives rank r chunks r and 2cp − 1 − r, so that under the causal mask every rank has the same
work; `balance="none"` gives rank r the r-th contiguous cp-th, and the last rank does cp times the first
rank's work (`unmasked_pairs` counts it).

**Forward.** cp steps: at step i the rank holds the K/V block of rank r − i; it computes its queries
against that block while the block travels on to rank r + 1 and the next arrives from rank r − 1
(`Ring.exchange`: one send and one receive, posted together, so the transfer overlaps the compute).
Each step's partial result is merged into the running one by its log-sum-exp (online softmax): with
(o₁, ℓ₁) and (o₂, ℓ₂), ℓ = log(e^ℓ₁ + e^ℓ₂) and o = o₁·e^(ℓ₁−ℓ) + o₂·e^(ℓ₂−ℓ). A block every one of
whose keys lies after every query is skipped (the causal mask would zero it). The rank holds its own
K/V and one block in flight: cp − 1 transfers of 2·b·s/cp·kv_dim values per layer (kv_dim = h, or with
grouped-query attention kv_heads·head_dim: the blocks travel with their kv_heads and are expanded to the
query heads only where they are used).

**Backward.** A second ring: the K/V blocks travel again, with a dK/dV buffer beside each; every rank
adds its queries' contribution to the block it holds (recomputing the block's probabilities from the
saved log-sum-exp, as flash attention's backward does) and passes both on; after cp hops the dK/dV
buffer is back on the rank that owns the block. So backward moves twice forward's bytes.

Nothing here knows about processes: a `Ring` is given its rank, size, every rank's token positions and
an `exchange` function (engine: the traced Communicator's batch_isend_irecv over the cp group; tests:
torch.distributed directly).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

BALANCES = ("head-tail", "none")


def chunks_of(rank: int, cp: int, balance: str = "head-tail") -> list[int]:
    """The sequence chunks rank `rank` holds: [r, 2cp − 1 − r] of 2·cp (head-tail), or [r] of cp (none)."""
    if balance not in BALANCES:
        raise ValueError(f"balance={balance!r}: valid are {BALANCES}")
    return [rank, 2 * cp - 1 - rank] if balance == "head-tail" else [rank]


def positions(seq_len: int, rank: int, cp: int, balance: str = "head-tail") -> torch.Tensor:
    """The global token positions rank `rank` holds, in its local order."""
    n = 2 * cp if balance == "head-tail" else cp
    if seq_len % n:
        raise ValueError(
            f"seq_len={seq_len} must split into {n} equal chunks (cp={cp}, balance={balance!r})"
        )
    size = seq_len // n
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks_of(rank, cp, balance)])


def shard(
    x: torch.Tensor, rank: int, cp: int, balance: str = "head-tail", dim: int = 1
) -> torch.Tensor:
    """This rank's tokens of a full-sequence tensor (sequence along `dim`), as a tensor of its own."""
    return x.index_select(dim, positions(x.size(dim), rank, cp, balance).to(x.device)).contiguous()


def unmasked_pairs(q_pos: torch.Tensor, k_pos: torch.Tensor) -> int:
    """Causal query-key pairs (key position ≤ query position) between two position sets: the work."""
    return int((k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)).sum())


@dataclass(kw_only=True)
class Ring:
    """One rank's view of its context-parallel group: who it is, where every rank's tokens sit, and how
    to pass tensors on. `exchange(tensors)` sends each to rank + 1 and receives same-shaped ones from
    rank − 1, returning a function that waits and gives them."""

    rank: int
    size: int
    pos: list[torch.Tensor]  # every rank's token positions
    exchange: Callable[[list[torch.Tensor]], Callable[[], list[torch.Tensor]]]
    pairs: int = 0  # unmasked query-key pairs this rank computed in forward (work, for the balance)
    #: rotate="allgather" (torch's other design): every rank's tensor, in rank order (one all-gather), and
    #: the sum over ranks of a per-rank list, each rank keeping its own entry (one reduce-scatter)
    gather: Callable[[torch.Tensor], list[torch.Tensor]] | None = None
    scatter_sum: Callable[[list[torch.Tensor]], torch.Tensor] | None = None
    #: the same positions on the compute device, where each block's causal mask is built (`pos` stays on the
    #: host for the decisions the host makes: which blocks to skip, the pairs counted); None: `pos` itself
    device_pos: list[torch.Tensor] | None = None

    def at(self, src: int) -> torch.Tensor:
        """Rank `src`'s positions where the masks are built."""
        return self.pos[src] if self.device_pos is None else self.device_pos[src]


def _scores(
    q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """Scaled scores, causally masked; the positions on the scores' device (a mask copied from host memory would
    make the host wait at every block of every layer)."""
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    return s.masked_fill(k_pos.unsqueeze(0) > q_pos.unsqueeze(1), float("-inf"))


def _skipped(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    return bool(k_pos.min() > q_pos.max())


def _grouped(k: torch.Tensor, heads: int) -> torch.Tensor:
    """A (b, kv_heads, s, d) K or V block expanded to the `heads` query heads it serves (grouped-query
    attention: head j uses K/V head j // (heads/kv_heads)); itself when there are as many."""
    b, kv, s, d = k.shape
    return (
        k
        if kv == heads
        else k.unsqueeze(2).expand(b, kv, heads // kv, s, d).reshape(b, heads, s, d)
    )


def _ungrouped(g: torch.Tensor, kv: int) -> torch.Tensor:
    """The gradient of an expanded block summed back onto its kv_heads (the transpose of `_grouped`)."""
    b, heads, s, d = g.shape
    return g if kv == heads else g.view(b, kv, heads // kv, s, d).sum(2)


def _block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q against one K/V block: (out, lse); rows with no visible key get lse −inf."""
    k, v = _grouped(k, q.size(1)), _grouped(v, q.size(1))
    s = _scores(q, k, q_pos, k_pos).float()
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0))
    return (p.to(v.dtype) @ v).float(), lse


def _merge(
    out: torch.Tensor | None, lse: torch.Tensor | None, o: torch.Tensor, ls: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if out is None or lse is None:
        return o, ls
    new = torch.logaddexp(lse, ls)
    safe = new.masked_fill(torch.isinf(new), 0.0)
    return out * torch.exp(lse - safe) + o * torch.exp(ls - safe), new


class RingAttention(torch.autograd.Function):
    """softmax(q·kᵀ/√d, causal)·v over a context-parallel group (module docstring); q, k, v are this
    rank's (b, heads, s/cp, d) tokens, in `ring.pos[ring.rank]` order."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring
    ) -> torch.Tensor:
        me = ring.pos[ring.rank]
        kv = torch.stack([k, v]).contiguous()
        out = lse = None
        for i in range(ring.size):
            src = (ring.rank - i) % ring.size
            # the next block, while computing
            pending = ring.exchange([kv]) if i < ring.size - 1 else None
            if not _skipped(me, ring.pos[src]):
                o, ls = _block(q, kv[0], kv[1], ring.at(ring.rank), ring.at(src))
                out, lse = _merge(out, lse, o, ls)
                ring.pairs += unmasked_pairs(me, ring.pos[src])
            if pending is not None:
                kv = pending()[0]
        assert out is not None and lse is not None  # a rank always sees its own tokens
        result = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, result, lse)
        ctx.ring = ring
        return result

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring: Ring = ctx.ring
        me = ring.pos[ring.rank]
        delta = (dout.float() * out.float()).sum(-1, keepdim=True)
        dq = torch.zeros_like(q, dtype=torch.float32)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv, dtype=torch.float32)
        for i in range(ring.size):
            src = (ring.rank - i) % ring.size
            if not _skipped(me, ring.pos[src]):
                gq, gk, gv = _block_grads(
                    q,
                    kv[0],
                    kv[1],
                    dout,
                    lse=lse,
                    delta=delta,
                    q_pos=ring.at(ring.rank),
                    k_pos=ring.at(src),
                )
                dq += gq
                dkv[0] += gk
                dkv[1] += gv
            # the block and its gradient move on together; after the last step only the gradient, home
            if i < ring.size - 1:
                kv, dkv = ring.exchange([kv, dkv])()
            elif ring.size > 1:
                dkv = ring.exchange([dkv])()[0]
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


def _block_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    *,
    lse: torch.Tensor,
    delta: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """(dq, dk, dv) of one block, its probabilities recomputed from the saved log-sum-exp; dk and dv on the
    block's own kv_heads."""
    scale, kv = 1.0 / math.sqrt(q.size(-1)), k.size(1)
    k, v = _grouped(k, q.size(1)), _grouped(v, q.size(1))
    p = torch.exp(_scores(q, k, q_pos, k_pos).float() - lse.masked_fill(torch.isinf(lse), 0.0))
    ds = p * (dout.float() @ v.float().transpose(-2, -1) - delta)
    dk = (ds.transpose(-2, -1) @ q.float()) * scale
    return (
        (ds @ k.float()) * scale,
        _ungrouped(dk, kv),
        _ungrouped(p.transpose(-2, -1) @ dout.float(), kv),
    )


class AllGatherAttention(torch.autograd.Function):
    """The same attention with every rank's K/V gathered at once (torch's "allgather" rotation): one
    collective instead of cp − 1 steps, but all cp blocks held until backward, which reduce-scatters dK/dV
    to their owners."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring
    ) -> torch.Tensor:
        assert ring.gather is not None and ring.scatter_sum is not None
        me = ring.pos[ring.rank]
        blocks = ring.gather(torch.stack([k, v]).contiguous())
        out = lse = None
        for src, kv in enumerate(blocks):
            if not _skipped(me, ring.pos[src]):
                o, ls = _block(q, kv[0], kv[1], ring.at(ring.rank), ring.at(src))
                out, lse = _merge(out, lse, o, ls)
                ring.pairs += unmasked_pairs(me, ring.pos[src])
        assert out is not None and lse is not None
        result = out.to(q.dtype)
        ctx.save_for_backward(q, result, lse, *blocks)
        ctx.ring = ring
        return result

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, out, lse, *blocks = ctx.saved_tensors
        ring: Ring = ctx.ring
        me = ring.pos[ring.rank]
        delta = (dout.float() * out.float()).sum(-1, keepdim=True)
        dq = torch.zeros_like(q, dtype=torch.float32)
        dkvs = [torch.zeros_like(kv, dtype=torch.float32) for kv in blocks]
        for src, kv in enumerate(blocks):
            if not _skipped(me, ring.pos[src]):
                gq, gk, gv = _block_grads(
                    q,
                    kv[0],
                    kv[1],
                    dout,
                    lse=lse,
                    delta=delta,
                    q_pos=ring.at(ring.rank),
                    k_pos=ring.at(src),
                )
                dq += gq
                dkvs[src][0] += gk
                dkvs[src][1] += gv
        assert ring.scatter_sum is not None
        dkv = ring.scatter_sum(dkvs)
        return dq.to(q.dtype), dkv[0].to(blocks[0].dtype), dkv[1].to(blocks[0].dtype), None


ROTATIONS = ("ring", "allgather")


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, rotate: str = "ring"
) -> torch.Tensor:
    """Causal attention of this rank's q against the whole group's k, v (`rotate`: "ring" or "allgather")."""
    if rotate not in ROTATIONS:
        raise ValueError(f"rotate={rotate!r}: valid are {ROTATIONS}")
    return (RingAttention if rotate == "ring" else AllGatherAttention).apply(q, k, v, ring)
