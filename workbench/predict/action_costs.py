"""What one rank's forward and backward of one micro-batch cost: the terms the step-time model
(predict/step_time.py) puts together.

A micro-batch's forward on one stage (backward: × the measured backward ratio, plus the forward again
under full recomputation):

    per layer   layer_fwd_s (fixed: Python, launches)  + matmul FLOPs / matmul_flops
                + attention FLOPs / attention_flops     + element-wise bytes / memory_bw
                + its tensor-parallel collectives: α(ranks) each + bytes · bus factor / β
                + under context parallelism (s/cp tokens a rank): the ring's K/V transfers, each hidden
                  under one block's attention in forward (exposed: what it lasts beyond it), and
                  backward's K/V with dK/dV, waited for at once (parallel/ring_attention.py)
    per stage   the embeddings on the first, the head and loss on the last (fixed + per sample)

On a CPU with more ranks than cores every compute term is stretched by the measured share of a core
(`Hardware.contention`), and α is a collective's cost measured with that many ranks running. On GPUs
the stretch is 1 and α, β are the links'. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from workbench.config import ModelConfig


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What the step-time model needs of a run."""

    model: ModelConfig
    dp: int = 1
    tp: int = 1
    pp: int = 1
    v: int = 1
    m: int = 1
    micro: int = 1  # sequences per micro-batch
    zero: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    schedule: str = "1f1b"
    width: int = 4  # bytes per activation value
    grad_bytes: int = 4
    bucket_mb: float = 25.0
    rule: str = "gloo"  # the simulator's rule for pipeline transfers
    ranks_per_node: int = 0
    #: the step's data-parallel bytes each rank sends per link class (("intra", b), ("inter", b)): compression,
    #: 1-bit Adam and the hierarchical all-reduce included (run_layout.Traffic); () → the ring's
    dp_link_bytes: tuple[tuple[str, float], ...] = ()
    cp: int = 1  # context parallelism: each rank's s/cp tokens, attention as a ring over cp ranks
    cp_rotate: str = "ring"
    # expert parallelism (a model with experts): the dispatch's all-to-alls over ep ranks
    ep: int = 1

    @property
    def world(self) -> int:
        return self.dp * self.cp * self.tp * self.pp


def layer_matmul_flops(cfg: ModelConfig, micro: int, tp: int) -> float:
    """One block's forward matmuls for `micro` sequences on one tp rank: qkv (h × (h + 2·kv_dim)), proj, the
    MLP's two (SwiGLU: three) matrices (a mixture of experts: each token through top_k experts' MLPs, and the
    router's h·E)."""
    h = cfg.hidden
    attention = cfg.qkv_width + h
    mlp = (cfg.mlp_in_width + cfg.inner) * (cfg.top_k if cfg.experts else 1) + cfg.experts
    return 2 * micro * cfg.seq_len * (attention + mlp) * h / tp


def attention_flops(cfg: ModelConfig, micro: int, tp: int, keys: int | None = None) -> float:
    """q·kᵀ and probs·v: 2 · 2·b·s·s_k·h / t (causal masking still computes every score in eager mode; the
    ring computes every block it does not skip whole — the slowest rank all cp of them: s_k = cp·s)."""
    return 4 * micro * cfg.seq_len * (keys or cfg.seq_len) * cfg.hidden / tp


def head_flops(cfg: ModelConfig, micro: int, tp: int) -> float:
    return 2 * micro * cfg.seq_len * cfg.hidden * cfg.vocab_size / tp


def elementwise_bytes(
    cfg: ModelConfig,
    micro: int,
    tp: int,
    *,
    sequence_parallel: bool,
    width: int,
    keys: int | None = None,
) -> float:
    """What one block's forward reads and writes outside its matmuls: two norms and two residual adds on b·s·h
    (10 passes: replicated over tp unless sequence-parallel), the MLP's activation (GELU: 3 passes of f,
    SwiGLU: 5 — silu and the product) and the biases (5 passes of h, none without biases) on the sharded
    widths, and scale, mask and softmax on the a/t heads' s×s scores (6 passes; s × s_k under context
    parallelism, as `attention_flops`)."""
    s, h, f = cfg.seq_len, cfg.hidden, cfg.inner
    replicated = 10 * s * h / (tp if sequence_parallel else 1)
    activation = (5 if cfg.mlp == "swiglu" else 3) * f + (5 * h if cfg.bias else 0)
    sharded = (activation * s + 6 * cfg.heads * s * (keys or s)) / tp
    return micro * (replicated + sharded) * width


def _interp(table: tuple[tuple[float, ...], ...], world: int, col: int) -> float:
    """Linear in the number of ranks between measured rows (clamped at the ends)."""
    rows = sorted(table)
    if world <= rows[0][0]:
        return rows[0][col]
    for a, b in zip(rows, rows[1:], strict=False):
        if world <= b[0]:
            return a[col] + (b[col] - a[col]) * (world - a[0]) / (b[0] - a[0])
    return (
        rows[-1][col]
        if len(rows) == 1
        else rows[-1][col]
        + (rows[-1][col] - rows[-2][col]) * (world - rows[-1][0]) / (rows[-1][0] - rows[-2][0])
    )


def contention(hw: Any, world: int) -> tuple[float, float, float, float]:
    """(compute stretch, α of a collective, α of a pipeline transfer, the step's fixed cost) with `world`
    ranks running on this hardware."""
    if hw.contention and world > 1:
        return (
            max(1.0, _interp(hw.contention, world, 1)),
            _interp(hw.contention, world, 2),
            _interp(hw.contention, world, 3),
            max(_interp(hw.contention, world, 4), 0.0),
        )
    share = max(1.0, world / hw.cores) if hw.cores else 1.0
    p2p = hw.p2p_latency_s if hw.p2p_latency_s is not None else hw.latency_s
    return share, hw.latency_s, p2p, share * hw.step_overhead_s


@dataclass(frozen=True, kw_only=True)
class CostContext:
    """The figures every cost below shares: rates, the stretch of a shared core, α's, bandwidths — for one
    layout on one hardware (`cost_context`); the step-time model, the scaling edit (analysis/scaling.py)
    and calibration (studies/run_calibration.py) hand it to `layer_costs` and the stage costs."""

    mm: float
    at: float
    bw_mem: float
    stretch: float
    alpha: float  # one collective, emulated links' latency included
    alpha_p2p: float  # one pipeline transfer, likewise
    beta_tp: float
    beta_cp: float
    beta_ep: float
    beta_dp: float
    beta_pp: float
    beta_intra: float
    beta_inter: float
    step_s: float  # the step's fixed cost with this many ranks
    kappa: float  # a blocking collective's wait per second of work since the previous one (jitter)


def cost_context(L: Layout, hw: Any) -> CostContext:
    """The shared figures of layout `L` on `hw`: which links each group's collectives cross, and the
    contention of `L.world` ranks."""
    stretch, alpha, p2p, step = contention(hw, L.world)
    mm = hw.matmul_flops or hw.peak_flops * hw.efficiency
    per_node = L.ranks_per_node or hw.devices_per_node
    intra, inter = hw.intra_node_bw, hw.inter_node_bw
    return CostContext(
        mm=mm,
        at=hw.attention_flops or mm,
        bw_mem=hw.memory_bw,
        stretch=stretch,
        alpha=alpha + hw.extra_latency_s,
        alpha_p2p=p2p + hw.extra_latency_s,
        beta_tp=intra,
        beta_cp=intra if L.tp * L.cp <= per_node else inter,
        beta_ep=intra if L.tp * L.cp * L.ep <= per_node else inter,  # ep: consecutive dp ranks
        beta_dp=intra if L.tp * L.cp * L.dp <= per_node else inter,
        beta_pp=intra if L.world <= per_node else inter,
        beta_intra=intra,
        beta_inter=inter,
        step_s=step,
        kappa=_interp(hw.skew, L.world, 1) if hw.skew and L.world > 1 else 0.0,
    )


def _collective(c: CostContext, nbytes: float, factor: float, beta: float) -> float:
    """One collective moving `nbytes` · factor per rank (the bus factor)."""
    return c.alpha + c.stretch * nbytes * factor / beta


def layer_costs(L: Layout, hw: Any, c: CostContext) -> dict[str, tuple[float, float]]:
    """One block, one micro-batch, one rank: (forward, backward) seconds of compute, fixed cost and tp
    collectives."""
    cfg, b, t = local_model(L), L.micro, L.tp
    attn = attention_flops(cfg, b, t, L.model.seq_len) / c.at
    work = (
        layer_matmul_flops(cfg, b, t) / c.mm
        + attn
        + elementwise_bytes(
            cfg, b, t, sequence_parallel=L.sequence_parallel, width=L.width, keys=L.model.seq_len
        )
        / c.bw_mem
    )
    fwd, bwd = work, hw.backward_ratio * work
    fixed_f, fixed_b = hw.layer_fwd_s, hw.layer_bwd_s
    comm_f = comm_b = 0.0
    if t > 1:
        full = b * cfg.seq_len * cfg.hidden * L.width
        busy_f, busy_b = c.stretch * (fwd + fixed_f), c.stretch * (bwd + fixed_b)
        # all-gather before, reduce-scatter after attention and MLP; backward also regathers
        if L.sequence_parallel:
            comm_f = 4 * _collective(c, full, (t - 1) / t, c.beta_tp) + c.kappa * busy_f
            comm_b = 6 * _collective(c, full, (t - 1) / t, c.beta_tp) + c.kappa * busy_b
        else:  # g after attn.proj and mlp.proj; f before qkv and fc in backward
            comm_f = 2 * _collective(c, full, 2 * (t - 1) / t, c.beta_tp) + c.kappa * busy_f
            comm_b = 2 * _collective(c, full, 2 * (t - 1) / t, c.beta_tp) + c.kappa * busy_b
    if L.recompute == "full":
        bwd, fixed_b, comm_b = bwd + fwd, fixed_b + fixed_f, comm_b + comm_f
    elif L.recompute == "selective":
        bwd += attn
    ring_f, ring_b = _ring(L, c, c.stretch * attn / L.cp)
    if L.recompute != "none":  # the rerun of the core rotates K/V again
        ring_b += ring_f
    a2a = 0.0
    # dispatch and combine, each way: T·k rows of h values, (ep − 1)/ep of them leaving the rank
    if L.ep > 1:
        rows = b * cfg.seq_len * cfg.top_k * cfg.hidden * L.width
        a2a = 2 * _collective(c, rows, (L.ep - 1) / L.ep, c.beta_ep)
    return {
        "compute": (c.stretch * fwd, c.stretch * bwd),
        "overhead": (c.stretch * fixed_f, c.stretch * fixed_b),
        "tp": (comm_f, comm_b),
        "cp": (ring_f, ring_b),
        "ep": (a2a, a2a),
    }


def local_model(L: Layout) -> ModelConfig:
    """The model as one rank's tokens see it: s/cp of them under context parallelism."""
    return replace(L.model, seq_len=L.model.seq_len // L.cp) if L.cp > 1 else L.model


def _ring(L: Layout, c: CostContext, block_s: float) -> tuple[float, float]:
    """Context parallelism's exposed (forward, backward) seconds per layer and micro-batch: K/V blocks of
    2·b·(s/cp)·(h/t) values; forward's cp − 1 each hidden under a block's attention (`block_s`), backward's
    cp − 1 with fp32 dK/dV beside and one last dK/dV hop, not hidden; rotate='allgather': one all-gather
    and one reduce-scatter of the cp blocks."""
    if L.cp == 1:
        return 0.0, 0.0
    kv = 2 * L.micro * L.model.seq_len / L.cp * L.model.hidden / L.tp
    beta = c.beta_cp
    if L.cp_rotate != "ring":
        n = L.cp
        return (
            _collective(c, n * kv * L.width, (n - 1) / n, beta),
            _collective(c, n * kv * 4, (n - 1) / n, beta),
        )
    hop = c.alpha_p2p + c.stretch * kv * L.width / beta
    back = (
        (L.cp - 1) * (c.alpha_p2p + c.stretch * kv * (L.width + 4) / beta)
        + c.alpha_p2p
        + c.stretch * kv * 4 / beta
    )
    return (L.cp - 1) * max(hop - block_s, 0.0), back


def _ends(
    L: Layout, hw: Any, c: CostContext, *, first: bool, last: bool
) -> dict[str, tuple[float, float]]:
    """The embeddings (first stage) and the head with its loss (last stage), one micro-batch."""
    cfg, b, t = local_model(L), L.micro, L.tp
    e = hw.stage_ends or (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    fixed_f = (e[0] if first else 0.0) + (e[4] if last else 0.0)
    fixed_b = (e[2] if first else 0.0) + (e[6] if last else 0.0)
    head = head_flops(cfg, b, t) / c.mm
    per_f = (b * e[1] if first else 0.0) + (
        (b * e[5] / t if hw.stage_ends else head) if last else 0.0
    )
    per_b = (b * e[3] if first else 0.0) + (
        (b * e[7] / t if hw.stage_ends else 2 * head) if last else 0.0
    )
    comm_f = comm_b = 0.0
    if t > 1:
        full = b * cfg.seq_len * cfg.hidden * L.width
        embedding = _collective(c, full, 2 * (t - 1) / t, c.beta_tp) if first else 0.0
        comm_f = embedding + (3 * c.alpha if last else 0.0)  # the vocabulary-parallel loss's three
        comm_b = _collective(c, full, 2 * (t - 1) / t, c.beta_tp) if last else 0.0
    return {
        "compute": (c.stretch * per_f, c.stretch * per_b),
        "overhead": (c.stretch * fixed_f, c.stretch * fixed_b),
        "tp": (comm_f, comm_b),
    }
