"""Our ring all-reduce (send/recv) gives the backend's result, for sizes n does and does not divide,
and records 2(n−1) ring steps with a flow from each sender to its receiver."""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.comm.ring_allreduce import ring_chunks

SIZES = [1, 2, 3, 7, 64, 1000, 1001, 4099]


def _worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    from datetime import timedelta

    from workbench.comm.groups import ProcessGroups
    from workbench.comm.ring_allreduce import ring_all_reduce
    from workbench.comm.traced import Communicator
    from workbench.config.grid import RankGrid
    from workbench.trace.recorder import TraceRecorder

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    grid = RankGrid(dp=world)
    groups = ProcessGroups.create(grid, rank, 30)
    rec = TraceRecorder(
        rank=rank, world_size=world, backend="gloo", coords=grid.coords(rank), run_name="ring-test"
    )
    comm = Communicator(groups, rec)
    for size in SIZES:
        g = torch.Generator().manual_seed(1000 * rank + size)
        exact = torch.randint(-1000, 1000, (size,), generator=g).float()  # sums of integers: exact
        noisy = torch.randn(size, generator=g)
        for x, exact_match in ((exact, True), (noisy, False)):
            ours, ref = x.clone(), x.clone()
            ring_all_reduce(comm, ours, "dp")
            dist.all_reduce(ref)
            if exact_match:
                assert torch.equal(ours, ref), f"size {size}: ring differs from the backend"
            else:  # different summation order: equal up to fp32 rounding
                torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    rec.write(os.path.join(out_dir, f"trace_rank{rank}.json"))
    dist.barrier()
    dist.destroy_process_group()


def _run(world: int) -> list[dict]:
    import json

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(
            _worker, args=(world, os.path.join(d, "store"), d), nprocs=world, start_method="spawn"
        )
        traces = []
        for r in range(world):
            with open(os.path.join(d, f"trace_rank{r}.json")) as f:
                traces.append(json.load(f))
        return traces


def test_chunks_cover_the_buffer_even_when_n_does_not_divide_it():
    for numel in SIZES:
        for n in (2, 3, 4):
            chunks = ring_chunks(numel, n)
            assert sum(length for _, length in chunks) == numel
            assert max(c[1] for c in chunks) - min(c[1] for c in chunks) <= 1
            sliced = [t.numel() for t in torch.arange(numel).tensor_split(n)]
            assert [length for _, length in chunks] == sliced


# 4: notebook 01's dp4 ring
@pytest.mark.parametrize("world", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_ring_equals_backend_all_reduce_on_3_and_4_ranks(world):
    traces = _run(world)
    steps = [e for e in traces[0]["traceEvents"] if e.get("cat") == "ring_step"]
    assert len(steps) == 2 * (world - 1) * 2 * len(SIZES)
    first = steps[: 2 * (world - 1)]
    assert [s["args"]["phase"] for s in first] == ["reduce_scatter"] * (world - 1) + [
        "all_gather"
    ] * (world - 1)
    assert all(s["args"]["peer"] == 1 and s["args"]["recv_peer"] == world - 1 for s in first)
    starts = {e["id"] for t in traces for e in t["traceEvents"] if e.get("ph") == "s"}
    ends = {e["id"] for t in traces for e in t["traceEvents"] if e.get("ph") == "f"}
    assert starts == ends and len(starts) == world * len(steps)
