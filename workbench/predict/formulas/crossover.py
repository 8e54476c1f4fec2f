"""Where each strategy turns from compute-bound to communication-bound: its communication time over its
compute time as a function of the one variable that moves it, and the value at which that ratio is 1
(the Ultra-Scale Playbook's appendix; the scaling book's "batch size per chip at which data parallelism
becomes communication-bound"). F: the FLOP/s a rank's matmuls reach; BW: the link's bus bandwidth,
bytes/s; g: bytes per value sent (2 in bf16); α: a message's latency, seconds. Per step or layer as
stated; a ratio above 1 means the communication cannot hide behind the compute however well it overlaps.
Plain arithmetic, no torch.

    data parallel   each rank's step computes 6·N·B FLOPs (N parameters, B tokens a rank) and all-reduces
                    N gradients: 2(n−1)/n·g·N bytes  →  ratio ≈ g·F / (3·B·BW)   (n large)
                    crossover B* = g·F / (3·BW) tokens a rank: fewer, and DP is communication-bound
    ZeRO-3          two all-gathers and a reduce-scatter of N values  →  ratio ≈ g·F / (2·B·BW)
                    B* = g·F / (2·BW): 1.5 × data parallelism's
    tensor parallel a layer's forward computes 24·b·s·h²/t FLOPs and all-reduces b·s·h values twice:
                    4(t−1)/t·b·s·h·g bytes  →  ratio = (t − 1)·g·F / (6·h·BW), whatever b and s
                    crossover h* = (t − 1)·g·F / (6·BW): a narrower model is communication-bound
                    (the Playbook writes the same ratio as (t − 1)/(2h)·F/BW, counting per GEMM)
    pipeline        a stage's micro-batch computes 24·T·h²·ℓ FLOPs (T = b·s tokens, ℓ layers a stage) and
                    sends T·h·g bytes to the next, α + T·h·g/BW  →  ratio = (α + T·h·g/BW)·F / (24·T·h²·ℓ)
                    latency-bound below T* = α·F / (24·h²·ℓ − h·g·F/BW) tokens a micro-batch
"""

from __future__ import annotations

import math


def _passes(passes: int, n: int) -> float:
    """The gradients' traffic in units of g·N a rank: passes·(n−1)/n over n ranks (n = 0: many)."""
    return passes * (n - 1) / n if n else float(passes)


def dp_crossover(flops: float, bw: float, g: int = 2, n: int = 0) -> float:
    """Tokens a rank below which data parallelism is communication-bound: its all-reduce (2(n−1)/n·g·N
    bytes) against its step's compute (6·N·B FLOPs)."""
    return _passes(2, n) * g * flops / (6 * bw)


def dp_ratio(tokens_per_rank: float, flops: float, bw: float, g: int = 2, n: int = 0) -> float:
    """Data parallelism's all-reduce time over its step's compute: B*/B."""
    return dp_crossover(flops, bw, g, n) / tokens_per_rank


def zero3_crossover(flops: float, bw: float, g: int = 2, n: int = 0) -> float:
    """Tokens a rank below which ZeRO-3 is communication-bound: its two all-gathers and reduce-scatter
    (3·(n−1)/n·g·N bytes) against its step's compute."""
    return _passes(3, n) * g * flops / (6 * bw)


def zero3_ratio(tokens_per_rank: float, flops: float, bw: float, g: int = 2, n: int = 0) -> float:
    """ZeRO-3's communication time over its step's compute: B*/B."""
    return zero3_crossover(flops, bw, g, n) / tokens_per_rank


def tp_crossover(t: int, flops: float, bw: float, g: int = 2) -> float:
    """The hidden size below which tensor parallelism over t ranks is communication-bound: a layer's two
    all-reduces of b·s·h values against its forward matmuls (24·b·s·h²/t FLOPs)."""
    return (t - 1) * g * flops / (6 * bw)


def tp_ratio(hidden: float, t: int, flops: float, bw: float, g: int = 2) -> float:
    """A layer's all-reduce time over its forward matmuls': h*/h."""
    return tp_crossover(t, flops, bw, g) / hidden


def pp_ratio(
    tokens: float,
    hidden: float,
    layers_per_stage: int,
    flops: float,
    bw: float,
    *,
    alpha: float,
    g: int = 2,
) -> float:
    """A micro-batch's send to the next stage (α + T·h·g/BW) over its stage's forward (24·T·h²·ℓ FLOPs)."""
    return (alpha + tokens * hidden * g / bw) * flops / (24 * tokens * hidden**2 * layers_per_stage)


def pp_crossover(
    hidden: float, layers_per_stage: int, flops: float, bw: float, *, alpha: float, g: int = 2
) -> float:
    """Tokens a micro-batch below which the pipeline's transfers outlast its compute (inf: never above)."""
    per_token = 24 * hidden**2 * layers_per_stage / flops - hidden * g / bw
    return alpha / per_token if per_token > 0 else math.inf


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline (Williams, Waterman and Patterson 2009): FLOP/s an operation of `intensity` FLOPs a byte
    can reach, min(peak, bandwidth × intensity)."""
    return min(peak_flops, bandwidth * intensity)


def ridge(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOPs a byte) where the roofline bends: below it, memory-bound."""
    return peak_flops / bandwidth
