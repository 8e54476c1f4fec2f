"""Bandwidth and bare latency of the run's backend, from a two-rank all-reduce at two sizes:

    allreduce_fit(backend="gloo") -> (α, β)      t = α + S · 2(n−1)/n / β, n = 2

What a collective costs inside a busy run (skew, waking, shared cores) is measured from real runs
instead (studies/run_calibration.py).
"""

from __future__ import annotations

import ast
import os
import statistics
import tempfile
import time
from functools import partial


def _init(rank: int, world: int, store_path: str, backend: str) -> str:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(
        backend,
        store=dist.FileStore(store_path, world),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    return device


def _spawn(fn, world: int, *args) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result")
        mp.start_processes(
            fn,
            args=(world, os.path.join(d, "store"), out, *args),
            nprocs=world,
            start_method="spawn",
        )
        with open(out) as f:
            return ast.literal_eval(f.read())


def _allreduce_worker(
    rank: int,
    world: int,
    store_path: str,
    out: str,
    *,
    backend: str,
    sizes: tuple[int, ...] = (1 << 10, 1 << 22),
    repeats: int = 12,
    stat: str = "median",
) -> None:
    import torch
    import torch.distributed as dist

    device = _init(rank, world, store_path, backend)
    results = {}
    for nbytes in sizes:
        buf = torch.ones(max(1, nbytes // 4), device=device)
        ts = []
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(buf)
            if device != "cpu":
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        results[buf.numel() * 4] = statistics.median(ts[2:]) if stat == "median" else min(ts[2:])
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(results))
    dist.barrier()
    dist.destroy_process_group()


def allreduce_times(
    sizes: tuple[int, ...],
    world: int = 2,
    backend: str = "gloo",
    repeats: int = 12,
    stat: str = "median",
) -> dict[int, float]:
    """Seconds of a `world`-rank all-reduce of each size in bytes (fp32 values, `repeats` times each after a
    barrier, the first two dropped): {bytes: seconds}, measured by the clock — the median (what a step
    typically pays), or with stat='min' the fastest (what the link and the algorithm cost when nothing else
    on a shared machine gets in the way: the α–β model's own quantity)."""
    if stat not in ("median", "min"):
        raise ValueError(f"stat={stat!r}: 'median' or 'min'")
    worker = partial(
        _allreduce_worker, backend=backend, sizes=tuple(sizes), repeats=repeats, stat=stat
    )
    return _spawn(worker, world)


def alpha_beta(times: dict[int, float], world: int) -> tuple[float, float]:
    """α (s) and β (bytes/s) of t = α + S·2(n−1)/n / β fitted to measured {bytes: seconds}, by least squares
    on the *relative* residual (weights 1/t²): over sizes from kilobytes to tens of megabytes a plain fit
    would follow only the largest sizes, and leave α — what the small ones measure — to chance."""
    factor = 2 * (world - 1) / world
    pts = [(factor * s, t, 1 / t**2) for s, t in times.items()]
    sw = sum(w for _, _, w in pts)
    mx, my = (sum(w * x for x, _, w in pts) / sw), (sum(w * y for _, y, w in pts) / sw)
    slope = sum(w * (x - mx) * (y - my) for x, y, w in pts) / sum(
        w * (x - mx) ** 2 for x, _, w in pts
    )
    return max(my - slope * mx, 1e-7), 1 / max(slope, 1e-15)


def allreduce_fit(backend: str = "gloo") -> tuple[float, float]:
    """α and β from a two-rank all-reduce at 1 KB and 4 MB: t = α + S·2(n−1)/n / β (the factor is 1)."""
    # two sizes: the line through both
    alpha, beta = alpha_beta(_spawn(partial(_allreduce_worker, backend=backend), 2), 2)
    return max(alpha, 1e-6), beta
