"""Measure this machine's terms of the step-time model, so that estimates of local runs can be held
against their measurements.

    hw = calibrate(model="tiny", out="traces/cal")    # a Hardware measured here; traces/cal/calibration.json
    hw = load_calibration("traces/cal")               # the same, read back

Every figure is measured on the backend and device the runs will use (`backend`: 'gloo' → the CPU,
'nccl' → one GPU per rank; 'auto' resolves as a launch does, launcher.choose_backend):

- compute (studies/compute_calibration.py): the matmul and attention FLOP rates, the element-wise
  bandwidth, a block's fixed cost forward and backward, the embeddings' and the head's, the optimizer's
  cost per value and per tensor — from the model's own modules, single-threaded on a CPU, with the
  engine's activation counting on;
- communication (studies/comm_calibration.py): α and β from a two-rank all-reduce at two sizes;
- from short real runs (studies/run_calibration.py), with n = 2, 4, 8 ranks (`worlds`): what a
  collective and a pipeline transfer cost inside a run, the stretch of compute on shared cores, the
  step's fixed cost, and a pipeline action's own cost;
- step_overhead_s: a real one-process run of the model, less what the model predicts for it (zero_grad,
  recording, the launcher's threads: what no other term holds);
- cores: the CPU count.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict, replace

from workbench.config import PRESETS, ModelConfig, RunConfig
from workbench.predict.estimator import Hardware

FILE = "calibration.json"


def calibrate(
    model: str | ModelConfig = "tiny",
    *,
    global_batch: int = 16,
    steps: int = 10,
    backend: str = "auto",
    worlds: tuple[int, ...] = (2, 4, 8),
    out: str | None = None,
    reuse: bool = False,
    repeats: int = 3,
) -> Hardware:
    """This machine's figures on `backend` ('auto': what a two-rank launch would run on here), for runs of
    up to max(worlds) ranks; each figure from real runs is the median over `repeats` of them, interleaved
    (a shared machine's slow minute falls on one); with `out`, also written to out/calibration.json — and
    with `reuse`, read from there instead when it was made for the same model, batch, backend and worlds."""
    from workbench.launching.launcher import choose_backend
    from workbench.studies.run_calibration import calibrate_in_runs

    backend = choose_backend(
        RunConfig(model=model, dp=2, global_batch=global_batch, backend=backend)
    )
    device = "cuda" if backend == "nccl" else "cpu"
    cfg = PRESETS[model] if isinstance(model, str) else model
    # format 3: with the measured spread
    made_for = {
        "format": 3,
        "model": asdict(cfg),
        "global_batch": global_batch,
        "backend": backend,
        "worlds": list(worlds),
        "repeats": repeats,
    }
    if reuse and out is not None and os.path.exists(os.path.join(out, FILE)):
        with open(os.path.join(out, FILE)) as f:
            if json.load(f).get("calibrated_for") == made_for:
                return load_calibration(out)
    hw = calibrate_compute(cfg, global_batch, backend)
    worlds = tuple(n for n in worlds if n >= 2 and n % 2 == 0 and (device == "cpu" or n <= _gpus()))
    base = {
        "model": model if isinstance(model, str) else asdict(model),
        "global_batch": global_batch,
        "steps": steps,
        "backend": backend,
    }
    with tempfile.TemporaryDirectory() as d:
        hw = replace(hw, step_overhead_s=_step_overhead(cfg, base, d, hw, repeats))
        runs = os.path.join(out, "runs") if out else d
        hw = calibrate_in_runs(cfg, hw, worlds, base, runs, repeats=repeats)
    if out is not None:
        save_calibration(hw, out, made_for)
    return hw


def calibrate_compute(cfg: ModelConfig, global_batch: int = 16, backend: str = "gloo") -> Hardware:
    """The part of calibrate() that needs no run: the model's compute rates and fixed costs measured in this
    process (micro-batches of 1 up to the global batch), α and β of a two-rank all-reduce, the cores — what
    a what-if of dp or microbatches needs to keep each action's fixed cost (analysis/what_if.py)."""
    from workbench.studies.comm_calibration import allreduce_fit
    from workbench.studies.compute_calibration import measure_compute

    device = "cuda" if backend == "nccl" else "cpu"
    sizes = tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= global_batch)
    compute = measure_compute(cfg, sizes, device)
    compute.pop("device")
    alpha, beta = allreduce_fit(backend)
    cores = os.cpu_count() or 1
    return Hardware(
        name=f"this machine (calibrated on {backend}, {device})",
        peak_flops=compute["matmul_flops"],
        memory_bytes=_memory_bytes() if device == "cpu" else _gpu_memory_bytes(),
        intra_node_bw=beta,
        inter_node_bw=beta,
        latency_s=alpha,
        devices_per_node=cores if device == "cpu" else _gpus(),
        efficiency=1.0,
        usable_memory=1.0,
        cores=cores if device == "cpu" else None,
        **compute,
    )


def _step_overhead(cfg: ModelConfig, base: dict, out: str, hw: Hardware, repeats: int = 1) -> float:
    """One-process runs' median step (after the first; the median over `repeats` runs) less the model's
    prediction of it."""
    import workbench as wb
    from workbench.predict.action_costs import Layout
    from workbench.predict.step_time import predict_step

    measured = statistics.median(
        float(
            wb.launch(
                RunConfig.from_dict(base),
                out=os.path.join(out, f"one_process_{k}"),
                progress=False,
                force=True,
            )
            .metrics.step_time_s.iloc[1:]
            .median()
        )
        for k in range(repeats)
    )
    return max(
        measured - predict_step(Layout(model=cfg, micro=base["global_batch"]), hw).total_s, 0.0
    )


def save_calibration(hw: Hardware, out: str, made_for: dict | None = None) -> str:
    """out/calibration.json: the Hardware's fields, and what it was calibrated for."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, FILE)
    with open(path, "w") as f:
        json.dump({**asdict(hw), "calibrated_for": made_for}, f, indent=1)
    return path


def load_calibration(path: str) -> Hardware:
    """A Hardware from calibration.json (or a directory holding one)."""
    if os.path.isdir(path):
        path = os.path.join(path, FILE)
    with open(path) as f:
        d = json.load(f)
    d.pop("calibrated_for", None)
    d["contention"] = tuple(tuple(row) for row in d.get("contention", ()))
    d["skew"] = tuple(tuple(row) for row in d.get("skew", ()))
    if d.get("stage_ends") is not None:
        d["stage_ends"] = tuple(d["stage_ends"])
    return Hardware(**d)


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
