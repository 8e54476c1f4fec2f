"""Measure this machine's compute and communication rates, so that estimates of local runs can be
checked against their measurements.

    hw = calibrate(model="tiny")     # a Hardware whose figures were measured here

Each figure is measured on the backend and device the runs will use (`backend`: 'gloo' → the CPU,
'nccl' → one GPU per rank; 'auto' resolves as a launch does, launcher.choose_backend):

- peak_flops: an fp32 matrix multiply of the model's shapes on the device (single-threaded on a CPU: what
  one rank gets);
- bandwidth: an all-reduce between two processes at two sizes, fitted to t = α + S·2(n−1)/n / β;
- latency_s: what one small collective costs inside a real two-rank run of the model (the median of
  its 4-byte loss all-reduce) — larger than the bare α, and what the steps actually pay;
- step_overhead_s: a one-process run of the model: its measured step time minus its FLOPs at that rate
  (Python, kernel launches and the optimizer: what a FLOP count does not see);
- cores: the CPU count (ranks beyond it share cores).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from workbench.config import PRESETS, ModelConfig, RunConfig
from workbench.predict.estimator import Hardware


def _matmul_flops(cfg: ModelConfig, rows: int, device: str = "cpu") -> float:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(rows, cfg.hidden, device=device)
    b = torch.randn(cfg.hidden, 4 * cfg.hidden, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        sync()
        t = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - t)
    return 2 * rows * cfg.hidden * 4 * cfg.hidden / statistics.median(times)


def _allreduce_worker(rank: int, world: int, store_path: str, out: str, backend: str = "gloo") -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    results = {}
    for numel in (256, 1 << 20):
        buf = torch.ones(numel, device=device)
        ts = []
        for _ in range(12):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(buf)
            if device != "cpu":
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        results[numel * 4] = statistics.median(ts[2:])
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(results))
    dist.barrier()
    dist.destroy_process_group()


def _allreduce_fit(backend: str = "gloo") -> tuple[float, float]:
    import ast

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result")
        mp.start_processes(_allreduce_worker, args=(2, os.path.join(d, "store"), out, backend), nprocs=2,
                           start_method="spawn")
        with open(out) as f:
            r = ast.literal_eval(f.read())
    (s0, t0), (s1, t1) = sorted(r.items())
    beta = (s1 - s0) / max(t1 - t0, 1e-9)  # 2(n−1)/n = 1 for two ranks
    alpha = max(t0 - s0 / beta, 1e-6)
    return alpha, beta


def calibrate(model: str | ModelConfig = "tiny", global_batch: int = 16, steps: int = 6,
              backend: str = "auto") -> Hardware:
    """This machine's figures on `backend` ('auto': what a two-rank launch would run on here)."""
    import workbench as wb
    from workbench.launcher import choose_backend

    backend = choose_backend(RunConfig(model=model, dp=2, global_batch=global_batch, backend=backend))
    device = "cuda" if backend == "nccl" else "cpu"
    cfg = PRESETS[model] if isinstance(model, str) else model
    flops = _matmul_flops(cfg, global_batch * cfg.seq_len, device)
    alpha, beta = _allreduce_fit(backend)
    with tempfile.TemporaryDirectory() as d:
        run = wb.launch(RunConfig(model=model, steps=steps, global_batch=global_batch, backend=backend),
                        out=os.path.join(d, "cal"), progress=False)
        from workbench.predict import formulas

        measured = float(run.metrics.step_time_s.iloc[1:].median())
        compute = formulas.training_flops_per_token(cfg.param_count(), cfg) * global_batch * cfg.seq_len / flops
        # a collective's cost inside a real two-rank run (scheduling, the traced layer, the peer's skew):
        # the blocking 4-byte loss all-reduce of a dp=2 run
        pair = wb.launch(RunConfig(model=model, dp=2, steps=steps, global_batch=global_batch, backend=backend),
                         out=os.path.join(d, "pair"), progress=False)
        ev = pair.events
        small = ev[(ev.label == "loss") & (ev.step > 0) & (ev.cat == "collective")]
        alpha = max(alpha, float(small.dur_us.median()) / 1e6) if len(small) else alpha
    cores = os.cpu_count() or 1
    return Hardware(f"this machine (calibrated on {backend}, {device})", peak_flops=flops,
                    memory_bytes=_memory_bytes() if device == "cpu" else _gpu_memory_bytes(),
                    intra_node_bw=beta, inter_node_bw=beta, latency_s=alpha,
                    devices_per_node=cores if device == "cpu" else _gpus(), efficiency=1.0, usable_memory=1.0,
                    step_overhead_s=max(measured - compute, 0.0), cores=cores if device == "cpu" else None)


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _gpu_memory_bytes() -> float:
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory)


def _memory_bytes() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0.0
