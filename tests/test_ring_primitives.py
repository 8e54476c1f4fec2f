"""Reduce-scatter, all-gather and broadcast as rings of send/recv: equal to the backend's collectives,
with the bytes each rank sends as the formulas say — (n−1)/n·S for the first two, S for a broadcast's
forwarding ranks — and every step recorded."""

import pytest

from tests.distributed import make_comm, run_ranks


def _check(rank, world):
    import torch
    import torch.distributed as dist

    from workbench.comm.ring_primitives import ring_all_gather, ring_broadcast, ring_reduce_scatter

    comm = make_comm(rank, world, dp=world)
    g = torch.Generator().manual_seed(rank)
    for per in (1, 5, 257):
        x = torch.randn(world * per, generator=g)
        ours, ref = torch.empty(per), torch.empty(per)
        ring_reduce_scatter(comm, ours, x)
        dist.reduce_scatter_tensor(ref, x.clone())
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
        mine = torch.randn(per, generator=g)
        ours, ref = torch.empty(world * per), torch.empty(world * per)
        ring_all_gather(comm, ours, mine)
        dist.all_gather_into_tensor(ref, mine)
        assert torch.equal(ours, ref)
        for src in range(world):
            ours = (
                torch.randn(world * per + 3, generator=g)
                if rank != src
                else torch.arange(world * per + 3.0)
            )
            ring_broadcast(comm, ours, src)
            assert torch.equal(ours, torch.arange(world * per + 3.0)), (src, rank)
    steps = [e for e in comm.recorder.events if e["name"] == "ring_step"]
    sent = {}
    for e in steps:
        sent[(e["args"]["phase"], e["args"]["seq"])] = (
            sent.get((e["args"]["phase"], e["args"]["seq"]), 0) + e["args"]["bytes"]
        )
    records = {e["args"]["seq"]: e for e in comm.recorder.events if e.get("cat") == "collective"}
    for (phase, seq), nbytes in sent.items():
        total = records[seq]["args"]["bytes"]
        if phase in ("reduce_scatter", "all_gather"):
            assert nbytes == (world - 1) * total // world, (phase, nbytes, total)
        else:
            assert nbytes in (0, total), (
                "a broadcast's rank forwards the whole buffer, or (the last) nothing"
            )


@pytest.mark.parametrize("world", [3, pytest.param(2, marks=pytest.mark.slow)])
def test_ring_primitives_equal_the_backend(world):
    run_ranks(_check, world)
