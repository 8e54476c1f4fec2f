"""The compute terms of the step-time model, measured in one process on the run's device.

    measure_compute(PRESETS["tiny"], micro_sizes=(1, 4, 16), device="cpu") -> dict of figures

Each term is fitted to timings of the model's own modules (model/gpt.py), single-threaded on a CPU
(what one rank gets), synchronised on a GPU:

- `matmul_flops`, `attention_flops`: the rates of a Linear's matmul and of the attention core's two
  batched matmuls at the model's shapes — the slope of time against FLOPs over the micro-batch sizes;
- `memory_bw`: everything else a layer does (norms, residuals, GELU, softmax, biases) is memory-bound:
  the bytes it moves (action_costs.elementwise_bytes) over what a Block's time leaves after its matmuls;
- `layer_fwd_s`, `layer_bwd_s`: a Block's fixed cost per micro-batch (its time at zero tokens: Python,
  kernel launches, autograd) forward and backward — on a CPU most of a tiny model's step;
- `backward_ratio`: a Block's per-sample backward time over its forward (2 for matmuls alone);
- `stage_ends`: the embeddings (first stage) and the head with its loss (last stage), fixed and per
  sample, forward and backward;
- `optimizer_s_per_value`, `optimizer_s_per_tensor`: AdamW with clipping, per value and per tensor.

No torch at import (the planner imports the predict package): torch is imported inside the functions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING

from workbench.config import ModelConfig

if TYPE_CHECKING:  # annotations only: torch is imported inside the functions
    import torch


def _sync(device: str) -> Callable[[], None]:
    import torch

    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def _timer(device: str) -> Callable[[Callable[[], object]], float]:
    sync = _sync(device)

    def timed(fn: Callable[[], object], repeats: int = 9) -> float:
        for _ in range(2):
            fn()
        ts = []
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    return timed


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b·x; the intercept and slope clamped at 0 (a cost is never negative)."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def _fwd_bwd(
    module: Callable[[torch.Tensor], torch.Tensor],
    given: torch.Tensor,
    device: str,
    counting: Callable[[], AbstractContextManager[None]],
    *,
    leaf: bool = True,
    repeats: int = 9,
) -> tuple[float, float]:
    """Median forward and backward times of `module` on `given` (`leaf`: a fresh detached copy asking for its
    gradient each time; else `given` itself, token ids), each timed on its own, with the engine's counting
    of saved activations on (`counting`: MemoryTracker.count_saved_activations)."""
    sync = _sync(device)
    fwd, bwd = [], []
    for i in range(repeats + 2):
        x = given.detach().requires_grad_() if leaf else given
        sync()
        t0 = time.perf_counter()
        with counting():
            out = module(x)
        sync()
        t1 = time.perf_counter()
        out.float().sum().backward()
        sync()
        if i >= 2:
            fwd.append(t1 - t0)
            bwd.append(time.perf_counter() - t1)
    return statistics.median(fwd), statistics.median(bwd)


def _attention_core(q: torch.Tensor) -> torch.Tensor:
    """The attention core's two batched matmuls, q standing in for k and v."""
    return (q @ q.transpose(-2, -1)) @ q


def _counting(device: str) -> Callable[[], AbstractContextManager[None]]:
    import torch

    from workbench.measure.memory import MemoryTracker
    from workbench.trace.recorder import TraceRecorder

    recorder = TraceRecorder(
        rank=0,
        world_size=1,
        backend="calibration",
        coords={"dp": 0, "tp": 0, "pp": 0},
        run_name="calibration",
    )
    tracker = MemoryTracker(recorder, torch.device(device))
    return tracker.count_saved_activations


def measure_compute(
    cfg: ModelConfig, micro_sizes: tuple[int, ...] = (1, 4, 16), device: str = "cpu"
) -> dict:
    import torch

    from workbench.model.gpt import GPT, Block

    torch.set_num_threads(1)
    timed, counting = _timer(device), _counting(device)
    s, h = cfg.seq_len, cfg.hidden
    with torch.device(device):
        block = Block(cfg, "calibration")
        first = GPT(cfg, layers=range(0), first=True, last=False)
        last = GPT(cfg, layers=range(0), first=False, last=True)
    rows: dict[str, list[float]] = {k: [] for k in ("mm", "at", "lf", "lb", "ff", "fb", "hf", "hb")}
    for b in micro_sizes:
        x = torch.randn(b, s, h, device=device)
        w = torch.randn(h, cfg.inner, device=device)
        rows["mm"].append(timed(partial(torch.matmul, x, w)))
        q = torch.randn(b, cfg.heads, s, cfg.head_dim, device=device)
        rows["at"].append(timed(partial(_attention_core, q)))
        f, bw = _fwd_bwd(block, x, device, counting)
        rows["lf"].append(f)
        rows["lb"].append(bw)
        ids = torch.randint(cfg.vocab_size, (b, s), device=device)
        f, bw = _fwd_bwd(first, ids, device, counting, leaf=False)
        rows["ff"].append(f)
        rows["fb"].append(bw)
        f, bw = _fwd_bwd(partial(last, targets=ids), x, device, counting)
        rows["hf"].append(f)
        rows["hb"].append(bw)
    return _fitted(cfg, micro_sizes, rows, device) | _optimizer(cfg, device, timed)


def _fitted(
    cfg: ModelConfig, sizes: tuple[int, ...], rows: dict[str, list[float]], device: str
) -> dict:
    """The rates and fixed costs from the timings at each micro-batch size."""
    from workbench.predict.action_costs import (
        attention_flops,
        elementwise_bytes,
        layer_matmul_flops,
    )

    s, h, bs = cfg.seq_len, cfg.hidden, [float(b) for b in sizes]
    _, per_flop_mm = fit_line([2 * b * s * h * cfg.inner for b in sizes], rows["mm"])
    _, per_flop_at = fit_line([attention_flops(cfg, b, 1) for b in sizes], rows["at"])
    mm_rate, at_rate = 1 / max(per_flop_mm, 1e-18), 1 / max(per_flop_at, 1e-18)
    layer_fwd, per_b_fwd = fit_line(bs, rows["lf"])
    layer_bwd, per_b_bwd = fit_line(bs, rows["lb"])
    # what a sample's layer costs beyond its matmuls and attention is its element-wise traffic
    rest = (
        per_b_fwd - layer_matmul_flops(cfg, 1, 1) / mm_rate - attention_flops(cfg, 1, 1) / at_rate
    )
    memory_bw = (
        elementwise_bytes(cfg, 1, 1, sequence_parallel=False, width=4) / rest if rest > 0 else 1e15
    )
    ends = [x for key in ("ff", "fb", "hf", "hb") for x in fit_line(bs, rows[key])]
    return {
        "device": device,
        "matmul_flops": mm_rate,
        "attention_flops": at_rate,
        "memory_bw": memory_bw,
        "backward_ratio": per_b_bwd / per_b_fwd if per_b_fwd > 0 else 2.0,
        "layer_fwd_s": layer_fwd,
        "layer_bwd_s": layer_bwd,
        "stage_ends": tuple(ends),
    }


def _optimizer(cfg: ModelConfig, device: str, timed) -> dict:
    """AdamW with gradient clipping over the model's tensors, and over one flat tensor of the same size:
    the per-tensor and per-value costs."""
    import torch

    from workbench.optim.adamw import AdamW

    with torch.device(device):
        params = [torch.nn.Parameter(torch.randn(p.shape)) for p in _param_shapes(cfg)]
        flat = [torch.nn.Parameter(torch.randn(sum(p.numel() for p in params)))]
    for p in params + flat:
        p.grad = torch.randn_like(p)

    def step(ps: list) -> Callable[[], None]:
        opt = AdamW(ps, lr=1e-3)

        def run() -> None:
            torch.nn.utils.clip_grad_norm_(ps, 1.0)
            opt.step()

        return run

    many, one = timed(step(params)), timed(step(flat))
    n = sum(p.numel() for p in params)
    per_value = one / n
    per_tensor = max(many - one, 0.0) / max(len(params) - 1, 1)
    return {"optimizer_s_per_value": per_value, "optimizer_s_per_tensor": per_tensor}


def _param_shapes(cfg: ModelConfig) -> list:
    import torch

    from workbench.model.gpt import GPT

    with torch.device("meta"):
        return list(GPT(cfg).parameters())
