"""Run a function on n real gloo ranks inside a test (spawned processes, a FileStore: no port)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable


def _entry(rank: int, fn: Callable, world: int, store_path: str, args: tuple) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable, world: int, *args) -> None:
    """Call fn(rank, world, *args) on `world` processes; an assertion on any rank fails the test."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(
            _entry,
            args=(fn, world, os.path.join(d, "store"), args),
            nprocs=world,
            start_method="spawn",
        )


def make_comm(rank: int, world: int, dp: int = 1, tp: int = 1, name: str = "test"):
    """A traced Communicator over a fresh grid (every rank must call it)."""
    from workbench.comm.groups import ProcessGroups
    from workbench.comm.traced import Communicator
    from workbench.config.grid import RankGrid
    from workbench.trace.recorder import TraceRecorder

    grid = RankGrid(dp=dp, tp=tp)
    groups = ProcessGroups.create(grid, rank, 30)
    return Communicator(
        groups,
        TraceRecorder(
            rank=rank, world_size=world, backend="gloo", coords=grid.coords(rank), run_name=name
        ),
    )


def metrics_rows(run_dir: str) -> list[dict]:
    """A run's metrics.jsonl as rows, so far (none while it does not exist or a row is half written)."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []
