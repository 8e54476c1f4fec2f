"""Ring attention (parallel/ring_attention.py) equals full causal attention: the output and the gradients
of q, k and v, on cp = 2 and 4 real gloo ranks, with the head-tail balance and without, rotating K/V
round the ring and all-gathering it.

Tolerance 1e-5 (absolute, fp32, values of order 1): the ring sums each row's softmax in cp pieces merged
by their log-sum-exp instead of in one pass — a different summation order; measured ≤ 5e-7.
"""

import pytest
import torch

from tests.distributed import run_ranks
from workbench.parallel.ring_attention import chunks_of, positions, shard, unmasked_pairs

B, HEADS, SEQ, D = 2, 2, 16, 8


def _exchange(rank: int, size: int):
    import torch.distributed as dist

    def exchange(tensors):
        received = [torch.empty_like(t) for t in tensors]
        ops = []
        for t, r in zip(tensors, received, strict=True):
            ops += [
                dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % size),
                dist.P2POp(dist.irecv, r, (rank - 1) % size),
            ]
        requests = dist.batch_isend_irecv(ops)

        def wait():
            for q in requests:
                q.wait()
            return received

        return wait

    return exchange


def _collectives(world: int):
    import torch.distributed as dist

    def gather(t):
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t)
        return out

    def scatter_sum(parts):
        total = torch.stack(parts)
        dist.all_reduce(total)  # gloo has no reduce-scatter: the sum everywhere, each keeps its own
        return total[dist.get_rank()].clone()

    return gather, scatter_sum


def _equal_to_full_attention(rank: int, world: int) -> None:
    from workbench.parallel.ring_attention import Ring, ring_attention

    g = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(B, HEADS, SEQ, D, generator=g) for _ in range(4))
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    ref = ((full[0] @ full[1].transpose(-2, -1)) / D**0.5).masked_fill(mask, float("-inf")).softmax(
        -1
    ) @ full[2]
    ref.backward(grad)
    for balance, rotate in (
        ("head-tail", "ring"),
        ("none", "ring"),
        ("head-tail", "allgather"),
        ("none", "allgather"),
    ):
        mine = [shard(t, rank, world, balance, dim=2).requires_grad_() for t in (q, k, v)]
        gather, scatter_sum = _collectives(world)
        ring = Ring(
            rank=rank,
            size=world,
            pos=[positions(SEQ, r, world, balance) for r in range(world)],
            exchange=_exchange(rank, world),
            gather=gather,
            scatter_sum=scatter_sum,
        )
        out = ring_attention(*mine, ring, rotate)
        out.backward(shard(grad, rank, world, balance, dim=2))
        torch.testing.assert_close(
            out, shard(ref.detach(), rank, world, balance, dim=2), rtol=0, atol=1e-5
        )
        for name, t, f in zip("qkv", mine, full, strict=True):
            torch.testing.assert_close(
                t.grad,
                shard(f.grad, rank, world, balance, dim=2),
                rtol=0,
                atol=1e-5,
                msg=f"d{name} on rank {rank}, balance {balance}, {rotate}",
            )
        me = ring.pos[rank]
        assert ring.pairs == sum(unmasked_pairs(me, p) for p in ring.pos), (
            "every visible block computed once"
        )


# cp 4 in the engine: make test-all
@pytest.mark.parametrize("cp", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ring_attention_equals_full_causal_attention(cp):
    run_ranks(_equal_to_full_attention, cp)


def test_head_tail_balances_the_causal_work():
    """Per-rank unmasked pairs: head-tail gives every rank the same count (within one block); the
    contiguous split gives the last rank 2cp − 1 times the first's."""
    for cp in (2, 4, 8):
        seq = 16 * cp
        full = torch.arange(seq)
        for balance in ("head-tail", "none"):
            work = [unmasked_pairs(positions(seq, r, cp, balance), full) for r in range(cp)]
            assert sum(work) == seq * (seq + 1) // 2
            block = (seq // (2 * cp)) ** 2
            if balance == "head-tail":
                assert max(work) - min(work) <= block, work
            else:
                assert work == sorted(work) and work[-1] / work[0] == pytest.approx(
                    2 * cp - 1, rel=0.1
                ), work
    assert chunks_of(1, 4) == [1, 6] and chunks_of(1, 4, "none") == [1]
    assert positions(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]


def test_the_causal_masks_are_built_on_the_device_with_nothing_from_the_host():
    """Every block's mask comes from positions already on the compute device (copied once per run by
    parallel/context_parallel.py), so no block of any layer copies from host memory — each such copy on CUDA
    would make the host wait. The device is torch's `meta` here: a copy from the CPU to it is seen as an op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from workbench.parallel.ring_attention import Ring, ring_attention

    world, balance = 2, "head-tail"
    pos = [positions(SEQ, r, world, balance) for r in range(world)]
    q, k, v = (
        torch.empty(B, HEADS, SEQ // world, D, device="meta", requires_grad=True) for _ in range(3)
    )
    copies = []

    class FromTheHost(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if any(t.device.type == "cpu" for t in tensors) and any(
                t.device.type == "meta" for t in tensors
            ):
                copies.append(str(func))
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and tensors[0].device.type == "cpu":
                copies.append(str(func))
            return out

    for rotate in ("ring", "allgather"):
        ring = Ring(
            rank=0,
            size=world,
            pos=pos,
            exchange=lambda ts: lambda: ts,
            gather=lambda kv: [kv, kv],
            scatter_sum=lambda parts: parts[0],
            device_pos=[p.to("meta") for p in pos],
        )
        with FromTheHost():
            ring_attention(q, k, v, ring, rotate).sum().backward()
        assert copies == [], copies
