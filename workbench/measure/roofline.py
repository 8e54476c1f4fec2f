"""The machine underneath, measured here: how many FLOP/s a matmul reaches by shape, how many bytes a second
memory moves, and where each operation of a training step sits between the two (notebook 12).

    matmul_sweep(shapes)     each (m, n, k)'s best time and FLOP/s — the MAMF finder's way (Bekman,
                             ml-engineering: scan shapes, keep the best; the datasheet's peak is never met)
    stream()                 STREAM's copy (b = a) and triad (a = b + s·c), bytes a second (McCalpin 1995)
    step_ops(model, micro)   one training step's operations of a GPT block, the head's loss and AdamW:
                             FLOPs and bytes counted from their shapes (each op reads its inputs and writes
                             its outputs once), time measured — intensity = FLOPs / bytes, achieved FLOP/s

The counts (w bytes a value, T = b·s tokens, h hidden, f = 4h, a heads, V vocabulary):

    matmul (T×i)·(i×o)     2·T·i·o FLOPs;  (T·i + i·o + T·o)·w bytes
    attention core         q·kᵀ and p·v: 4·b·s²·h FLOPs;  (4·T·h + 2·b·a·s²)·w bytes (q, k, v and the
                           output; the s×s scores written and read back)
    softmax on b·a·s²      5 FLOPs a value (max, subtract, exp, sum, divide);  2·b·a·s²·w bytes
    layer norm on T·h      8 FLOPs a value;  2·T·h·w bytes (+ its 2h parameters)
    GELU on T·f            8 FLOPs a value (tanh's polynomial);  2·T·f·w bytes
    cross-entropy on T·V   5 FLOPs a logit;  T·V·w bytes read
    AdamW on N parameters  12 FLOPs a value;  7·N·4 bytes (p, g, m, v read; p, m, v written); timed on at
                           most 4 M values, scaled to N
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F  # torch's own name for it

from workbench.config import ModelConfig

#: AdamW is timed on at most this many values and scaled to the model's (GPT-2's 124 M would need 2 GB)
OPTIMIZER_SAMPLE = 2**22


def timed(fn: Callable[[], Any], repeats: int = 5, warmup: int = 2) -> float:
    """The median of `repeats` timings of `fn`, seconds (CUDA synchronised around each)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_sweep(
    shapes: Iterable[tuple[int, int, int]],
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    repeats: int = 3,
) -> list[dict[str, float]]:
    """Each (m, n, k): an (m×k)·(k×n) matmul's median time and FLOP/s (2·m·n·k FLOPs)."""
    out = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(k, n, dtype=dtype, device=device)
        seconds = timed(partial(torch.matmul, a, b), repeats=repeats, warmup=1)
        out.append(
            {"m": m, "n": n, "k": k, "seconds": seconds, "flops_per_s": 2 * m * n * k / seconds}
        )
    return out


def stream(
    values: int = 4_000_000, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> dict[str, float]:
    """Bytes a second of STREAM's copy (reads a, writes b: 2 values) and triad (reads b and c, writes a: 3)."""
    a = torch.randn(values, dtype=dtype, device=device)
    b, c = torch.empty_like(a), torch.randn_like(a)
    w = a.element_size()
    copy = timed(lambda: b.copy_(a))
    triad = timed(lambda: torch.add(b, c, alpha=3.0, out=a))
    return {"copy": 2 * values * w / copy, "triad": 3 * values * w / triad}


def _op(
    name: str, kind: str, *, flops: float, nbytes: float, seconds: float, count: int = 1
) -> dict[str, Any]:
    return {
        "op": name,
        "kind": kind,
        "flops": flops,
        "bytes": nbytes,
        "seconds": seconds,
        "count": count,
        "intensity": flops / nbytes,
        "flops_per_s": flops / seconds,
    }


def step_ops(
    cfg: ModelConfig,
    micro: int = 1,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """The forward operations of one GPT block (each `count` = cfg.layers times a step), the head's
    cross-entropy and AdamW over every parameter: FLOPs and bytes counted from the shapes (module
    docstring), time measured here. `count` says how often a step runs it (backward not included: its
    matmuls are twice the forward's, its element-wise ops about as many)."""
    b, s, h, a, V = micro, cfg.seq_len, cfg.hidden, cfg.heads, cfg.vocab_size
    f, T, L = cfg.inner, micro * cfg.seq_len, cfg.layers
    w = torch.tensor([], dtype=dtype).element_size()

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, dtype=dtype, device=device)

    x, ff = randn(T, h), randn(T, f)
    ops = []
    for name, i, o in (
        ("qkv matmul", h, 3 * h),
        ("attention out matmul", h, h),
        ("MLP up matmul", h, f),
        ("MLP down matmul", f, h),
    ):
        inp, weight = (x if i == h else ff), randn(i, o)
        ops.append(
            _op(
                name,
                "matmul",
                flops=2 * T * i * o,
                nbytes=(T * i + i * o + T * o) * w,
                seconds=timed(partial(torch.matmul, inp, weight), repeats),
                count=L,
            )
        )
    q = randn(b, a, s, h // a)
    scores = randn(b, a, s, s)
    ops.append(
        _op(
            "attention core (q·kᵀ, p·v)",
            "attention",
            flops=4 * b * s * s * h,
            nbytes=(4 * T * h + 2 * b * a * s * s) * w,
            seconds=timed(lambda: (q @ q.transpose(-2, -1)) @ q, repeats),
            count=L,
        )
    )
    ops.append(
        _op(
            "softmax",
            "element-wise",
            flops=5 * b * a * s * s,
            nbytes=2 * b * a * s * s * w,
            seconds=timed(lambda: torch.softmax(scores, dim=-1), repeats),
            count=L,
        )
    )
    norm = torch.nn.LayerNorm(h, dtype=dtype, device=device)
    with torch.no_grad():
        ops.append(
            _op(
                "layer norm (×2)",
                "element-wise",
                flops=8 * T * h,
                nbytes=(2 * T * h + 2 * h) * w,
                seconds=timed(lambda: norm(x), repeats),
                count=2 * L,
            )
        )
    ops.append(
        _op(
            "GELU",
            "element-wise",
            flops=8 * T * f,
            nbytes=2 * T * f * w,
            seconds=timed(lambda: F.gelu(ff, approximate="tanh"), repeats),
            count=L,
        )
    )
    logits, target = randn(T, V), torch.randint(V, (T,), device=device)
    ops.append(
        _op(
            "cross-entropy",
            "element-wise",
            flops=5 * T * V,
            nbytes=T * V * w,
            seconds=timed(lambda: F.cross_entropy(logits, target), repeats),
            count=1,
        )
    )
    n = cfg.param_count()
    # timed on k values and scaled to n: its cost is per value, bytes-bound
    k = min(n, OPTIMIZER_SAMPLE)
    p, g = torch.randn(k, device=device), torch.randn(k, device=device)
    m, v = torch.zeros(k, device=device), torch.zeros(k, device=device)
    ops.append(
        _op(
            "AdamW",
            "optimizer",
            flops=12 * n,
            nbytes=7 * n * 4,
            seconds=timed(lambda: _adamw(p, g, m, v), repeats) * n / k,
            count=1,
        )
    )
    return ops


def _adamw(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    """One AdamW step written out (torch._foreach ops would fuse some of it): what the count above counts."""
    m.mul_(0.9).add_(g, alpha=0.1)
    v.mul_(0.999).addcmul_(g, g, value=0.001)
    p.mul_(1 - 1e-4).addcdiv_(m, v.sqrt().add_(1e-8), value=-1e-3)
