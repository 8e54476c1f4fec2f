"""Memory of model states (Rajbhandari et al. 2020), parameters per rank, and the buffers ZeRO-2/3 stage and
gather beside them. Plain arithmetic, no torch."""

from __future__ import annotations

from workbench.config import ModelConfig

# Bytes per parameter for each model-state category, (parameter, gradient, optimizer_state).
# fp32 Adam: 4 + 4 + 8 (m and v). Mixed precision (ZeRO paper): 2 + 2 + 12 (fp32 master, m, v).
STATE_BYTES = {"fp32": (4, 4, 8), "mixed": (2, 2, 12), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}


def model_state_bytes(
    params: float,
    dp: int = 1,
    zero: int = 0,
    precision: str = "fp32",
    *,
    grad_bytes: int | None = None,
    offload: bool = False,
) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer states (Rajbhandari et al. 2020) on the device.

    Stage 0 keeps everything on every rank (16Ψ); stage 1 divides the optimizer states by N, stage 2
    the gradients too, stage 3 the parameters too (16Ψ/N). The same accounting holds for fp32 with the
    split 4 + 4 + 8. `grad_bytes=4` with 16-bit parameters: fp32 main gradients (Megatron's 18Ψ).
    `offload` (ZeRO-Offload, Ren et al. 2021): the optimizer states leave the device (`offload_host_bytes`
    says what the host holds instead): ZeRO-2 in mixed precision keeps (2 + 2/N)Ψ.
    """
    p_b, g_b, o_b = STATE_BYTES[precision]
    g_b = g_b if grad_bytes is None else grad_bytes
    n = dp
    return {
        "parameter": params * p_b / (n if zero >= 3 else 1),
        "gradient": params * g_b / (n if zero >= 2 else 1),
        "optimizer_state": 0.0 if offload else params * o_b / (n if zero >= 1 else 1),
    }


def offload_host_bytes(params: float, dp: int = 1) -> dict[str, float]:
    """ZeRO-Offload's host memory per rank: its 1/N slice of the fp32 master weights (4Ψ/N), of the fp32
    gradient the update reads (4Ψ/N) and of Adam's two moments (8Ψ/N) — 16Ψ/N in all, whatever the
    device's precision."""
    return {
        "parameter": 4 * params / dp,
        "gradient": 4 * params / dp,
        "optimizer_state": 8 * params / dp,
    }


def stage_params(
    cfg: ModelConfig, stage: int = 0, stages: int = 1, tp: int = 1, ep: int = 1
) -> int:
    """Parameters a tensor-parallel rank holds of pipeline stage `stage`: the split ones divided by t (q, k, v
    and the MLP's first projection with their biases, the output projections' weights, the token table and
    the head), the replicated ones whole (norms, learned positions, row-parallel biases); with experts, E/ep
    expert MLPs (whole) and the router (h·E) per layer. A tied head is the token table, counted once."""
    h, v, t = cfg.hidden, cfg.vocab_size, tp
    row_bias = h if cfg.bias else 0  # the output projections' biases: replicated
    attention = (cfg.attention_params() - row_bias) // t + row_bias
    mlp = (cfg.mlp_params() - row_bias) // t + row_bias
    if cfg.experts:
        mlp = cfg.experts // ep * cfg.mlp_params() + h * cfg.experts
    out = cfg.layers // stages * (2 * cfg.norm_params() + attention + mlp)
    if stage == 0:
        out += v * h // t + (cfg.embedding_params() - v * h)
    if stage == stages - 1:
        out += cfg.norm_params() + cfg.head_params() // t
    return out


def params_per_rank(
    cfg: ModelConfig,
    *,
    tp: int = 1,
    pp: int = 1,
    virtual_stages: int = 1,
    pp_rank: int = 0,
    placement: str = "loop",
    ep: int = 1,
) -> int:
    """Parameters one rank holds: its stages' (pp_rank, pp_rank + p, … in a loop; pp_rank and 2p − 1 −
    pp_rank in a V: ZBV, DualPipeV) share under tensor parallelism. DualPipe (`placement="dual"`): parts
    pp_rank and p − 1 − pp_rank of a model cut in p parts, one of each copy — twice a 1F1B rank's (DeepSeek's
    "2× parameters")."""
    if placement == "dual":
        return sum(stage_params(cfg, k, pp, tp, ep) for k in (pp_rank, pp - 1 - pp_rank))
    stages = pp * virtual_stages
    mine = [pp_rank, 2 * pp - 1 - pp_rank] if placement == "v" else range(pp_rank, stages, pp)
    return sum(stage_params(cfg, k, stages, tp, ep) for k in mine)


#: which rank holds which stage (schedules/actions.py's placements), by schedule name; the others: "loop"
STAGE_PLACEMENT = {"zbv": "v", "dualpipev": "v", "dualpipe": "dual"}


def placement_of(schedule: str) -> str:
    """The stage placement of a named schedule: "v" for ZBV and DualPipeV, "dual" for DualPipe, else
    "loop" (a CSV schedule's is in its file: formulas/run.py's `placement`)."""
    return STAGE_PLACEMENT.get(schedule, "loop")


#: ZeRO-2 buckets (ZeRO-3 units) whose full-size gradient copy may be in flight at once (parallel/zero.py)
ZERO_IN_FLIGHT = 2


def buffer_bytes(
    cfg: ModelConfig,
    local_params: float,
    dp: int,
    zero: int,
    *,
    bucket_mb: float = 25.0,
    width: int = 4,
    prefetch: bool = True,
    backend_copies: bool = False,
) -> dict[str, float]:
    """What a rank holds beside model states and activations, at the peak, by category:

    comm_buffer   ZeRO-2: the full-size gradient copies of ZERO_IN_FLIGHT buckets being reduce-scattered,
                  each with the 1/N slice it lands in; ZeRO-3: the same for units (a layer, an embedding).
    temporary     ZeRO-3: the gathered parameters of the unit computing and, with prefetch, of the next.
    (Bucketed DP and ZeRO-1 reduce in place: their buckets are the gradient category itself.)
    `backend_copies`: gloo runs each reduce-scatter as an all-reduce of a full-size copy of its input
    (comm/traced.py), one more copy per bucket or unit in flight; NCCL makes none."""
    if dp == 1 or zero < 2:
        return {"comm_buffer": 0.0, "temporary": 0.0}
    h, v = cfg.hidden, cfg.vocab_size
    unit = max(cfg.layer_params(), cfg.head_params(), v * h)  # a block, the head, the token table
    # staging, the slice it lands in, gloo's copy
    copies = 1 + 1 / dp + (1 if backend_copies else 0)
    if zero == 2:  # buckets of bucket_mb, or one tensor when a tensor is bigger
        staged = min(
            max(bucket_mb * 2**20, max(v * h, cfg.mlp_in_width * h) * width), local_params * width
        )
        # a model in one bucket: one
        in_flight = min(ZERO_IN_FLIGHT, -(-local_params * width // staged))
        return {"comm_buffer": in_flight * staged * copies, "temporary": 0.0}
    return {
        "comm_buffer": ZERO_IN_FLIGHT * unit * width * copies,
        "temporary": (2 if prefetch else 1) * unit * width,
    }
