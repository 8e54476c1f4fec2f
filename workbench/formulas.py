"""The analytic predictions the workbench puts beside every measurement (../shared/formulas.md).

Plain arithmetic, no torch: the notebooks, the summary writer and the estimator all call these.
Symbols: Ψ parameters, N data-parallel degree, p stages, m microbatches, v chunks per rank,
s sequence length, b microbatch size, h hidden size, a heads, L layers, V vocabulary.
"""

from __future__ import annotations

from typing import Any

from workbench.config import ModelConfig
from workbench.pipeline.schedule import Schedule, build_schedule

# Bytes per parameter for each model-state category, (parameter, gradient, optimizer_state).
# fp32 Adam: 4 + 4 + 8 (m and v). Mixed precision (ZeRO paper): 2 + 2 + 12 (fp32 master, m, v).
STATE_BYTES = {"fp32": (4, 4, 8), "mixed": (2, 2, 12), "bf16": (2, 2, 12), "fp16": (2, 2, 12)}


def model_state_bytes(params: float, dp: int = 1, zero: int = 0, precision: str = "fp32") -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer states (Rajbhandari et al. 2020).

    Stage 0 keeps everything on every rank (16Ψ); stage 1 divides the optimizer states by N, stage 2
    the gradients too, stage 3 the parameters too (16Ψ/N). The same accounting holds for fp32 with the
    split 4 + 4 + 8.
    """
    p_b, g_b, o_b = STATE_BYTES[precision]
    n = dp
    return {
        "parameter": params * p_b / (n if zero >= 3 else 1),
        "gradient": params * g_b / (n if zero >= 2 else 1),
        "optimizer_state": params * o_b / (n if zero >= 1 else 1),
    }


def activation_bytes_per_layer(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                               sequence_parallel: bool = False) -> float:
    """Bytes one transformer block of *our* GPT saves for backward, counted from its code the way
    Korthikanti et al. 2022 count Megatron's (34·sbh + 5·as²b for 16-bit activations with dropout):

        replicated across tp ranks   ln_1 input, ln_1 output, the residual after attention,
                                     ln_2 output                                  → 4·sbh values
        split by tp                  qkv output (q, k, v share it), attention output before the
                                     projection, fc output, GELU output          → (4 + 2r)·sbh/t
                                     softmax probabilities                        →   a·s²·b/t
        layer-norm mean and 1/σ      two per layer norm                           →   4·sb values

    (r = mlp_ratio, 4: 16·sbh in all at t = 1.) Sequence parallelism splits the replicated part and
    the layer-norm statistics t ways too, so everything is divided by t.
    """
    s, b, h, a, r, t = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads, cfg.mlp_ratio, tp
    replicated, stats = 4 * s * b * h, 4 * s * b
    if sequence_parallel:
        replicated, stats = replicated / t, stats / t
    return bytes_per_value * (replicated + (4 + 2 * r) * s * b * h / t + a * s * s * b / t + stats)


def recompute_activation_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none") -> tuple[float, float]:
    """(bytes a block keeps after forward, bytes held on top while one block is recomputed in backward).

    full:       keeps only its input, s·b·h values (÷t with sequence parallelism) — Korthikanti's 2·sbh
                in 16-bit; the rerun of one block rebuilds everything else it saves.
    selective:  keeps all but the attention core's tensors: the softmax probabilities (a·s²·b/t) are
                dropped; rerunning the core rebuilds them, plus contiguous copies of q, k, v (3·sbh/t)
                that the batched matmuls save.
    """
    s, b, h, a, t, w = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads, tp, bytes_per_value
    whole = activation_bytes_per_layer(cfg, micro_batch, bytes_per_value, tp, sequence_parallel)
    if recompute == "full":
        kept = w * s * b * h / (t if sequence_parallel else 1)
        return kept, whole - kept
    if recompute == "selective":
        probs = w * a * s * s * b / t
        return whole - probs, probs + w * 3 * s * b * h / t
    return whole, 0.0


def embedding_activation_bytes(cfg: ModelConfig, micro_batch: int, tp: int = 1,
                               sequence_parallel: bool = False) -> float:
    """What the first stage saves besides its blocks: token ids (int64) for the embedding lookup,
    positions, and under tensor parallelism the mask of tokens outside this rank's vocabulary slice."""
    s, b = cfg.seq_len, micro_batch
    if tp == 1:
        return 8 * s * b + 8 * s
    return 8 * s * b + s * b + 8 * s / (tp if sequence_parallel else 1)


def head_activation_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                          sequence_parallel: bool = False) -> float:
    """What the last stage saves besides its blocks: the final layer norm's input, output (the head's
    input) and statistics, and the loss's saved tensors — the log-softmax output, targets and the
    total weight; or under tensor parallelism this rank's vocabulary slice of the softmax, the local
    targets and their mask."""
    s, b, h, v, t, w = cfg.seq_len, micro_batch, cfg.hidden, cfg.vocab_size, tp, bytes_per_value
    # the loss runs in fp32 whatever the activations' precision: its saved softmax is 4 bytes a value
    if t == 1:
        return w * (2 * s * b * h + 2 * s * b) + 4 * s * b * v + 8 * s * b + 4
    split = t if sequence_parallel else 1
    return w * (2 * s * b * h + 2 * s * b) / split + 4 * s * b * v / t + 8 * s * b + s * b


def stage_activation_bytes(cfg: ModelConfig, micro_batch: int, stage: int, stages: int, bytes_per_value: int = 4,
                           tp: int = 1, sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes one microbatch's forward leaves saved on pipeline stage `stage` of `stages`."""
    kept, _ = recompute_activation_bytes(cfg, micro_batch, bytes_per_value, tp, sequence_parallel, recompute)
    out = cfg.layers // stages * kept
    if stage == 0:
        out += embedding_activation_bytes(cfg, micro_batch, tp, sequence_parallel)
    if stage == stages - 1:
        out += head_activation_bytes(cfg, micro_batch, bytes_per_value, tp, sequence_parallel)
    return out


def activation_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                     sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Peak bytes saved for backward by one micro-batch through the whole model on one rank: what the
    forward keeps, plus — with recomputation — the one block being recomputed during backward."""
    _, transient = recompute_activation_bytes(cfg, micro_batch, bytes_per_value, tp, sequence_parallel, recompute)
    return stage_activation_bytes(cfg, micro_batch, 0, 1, bytes_per_value, tp, sequence_parallel, recompute) + transient


def stage_params(cfg: ModelConfig, stage: int = 0, stages: int = 1, tp: int = 1) -> int:
    """Parameters a tensor-parallel rank holds of pipeline stage `stage`: the split ones divided by t,
    the replicated ones (position embeddings, layer norms, row-parallel biases) whole."""
    h, v, s, r, t = cfg.hidden, cfg.vocab_size, cfg.seq_len, cfg.mlp_ratio, tp
    per_layer = (3 * h * h + 3 * h + h * h + r * h * h + r * h + r * h * h) // t + 4 * h + 2 * h
    out = cfg.layers // stages * per_layer
    if stage == 0:
        out += v * h // t + s * h
    if stage == stages - 1:
        out += 2 * h + (h * v + v) // t
    return out


def params_per_rank(cfg: ModelConfig, tp: int = 1, pp: int = 1, virtual_stages: int = 1, pp_rank: int = 0) -> int:
    """Parameters one rank holds: its stages' (pp_rank, pp_rank + p, …) share under tensor parallelism."""
    stages = pp * virtual_stages
    return sum(stage_params(cfg, k, stages, tp) for k in range(pp_rank, stages, pp))


#: ZeRO-2 buckets (ZeRO-3 units) whose full-size gradient copy may be in flight at once (parallel/zero.py)
ZERO_IN_FLIGHT = 2


def buffer_bytes(cfg: ModelConfig, local_params: float, dp: int, zero: int, bucket_mb: float = 25.0,
                 width: int = 4, prefetch: bool = True) -> dict[str, float]:
    """What a rank holds beside model states and activations, at the peak, by category:

    comm_buffer   ZeRO-2: the full-size gradient copies of ZERO_IN_FLIGHT buckets being reduce-scattered,
                  each with the 1/N slice it lands in; ZeRO-3: the same for units (a layer, an embedding).
    temporary     ZeRO-3: the gathered parameters of the unit computing and, with prefetch, of the next.
    (Bucketed DP and ZeRO-1 reduce in place: their buckets are the gradient category itself.)"""
    if dp == 1 or zero < 2:
        return {"comm_buffer": 0.0, "temporary": 0.0}
    h, v, r = cfg.hidden, cfg.vocab_size, cfg.mlp_ratio
    unit = max(stage_params(cfg, 0, cfg.layers) - v * h - cfg.seq_len * h, v * h + v, v * h)  # a block, head, wte
    if zero == 2:  # buckets of bucket_mb, or one tensor when a tensor is bigger
        staged = min(max(bucket_mb * 2**20, max(v * h, r * h * h) * width), local_params * width)
        return {"comm_buffer": ZERO_IN_FLIGHT * staged * (1 + 1 / dp), "temporary": 0.0}
    return {"comm_buffer": ZERO_IN_FLIGHT * unit * width * (1 + 1 / dp),
            "temporary": (2 if prefetch else 1) * unit * width}


def korthikanti_activation_bytes_per_layer(cfg: ModelConfig, micro_batch: int, tp: int = 1) -> float:
    """Megatron's 16-bit figure for comparison: s·b·h·(10 + 24/t + 5·a·s/(h·t))."""
    s, b, h, a = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of a pipeline step with equal stage times: (p−1)/(v·m + p−1); v=1 is GPipe/1F1B."""
    return (p - 1) / (v * m + p - 1)


def dp_bytes_per_step(params: float, dp: int, zero: int = 0, grad_bytes: int = 4) -> float:
    """Gradient-synchronisation bytes each rank sends per step (ring algorithm): 2Ψ·(n−1)/n values
    for plain DP and ZeRO-1/2, 3Ψ·(n−1)/n for ZeRO-3 (parameters gathered twice)."""
    factor = 3 if zero >= 3 else 2
    return factor * (dp - 1) / dp * params * grad_bytes if dp > 1 else 0.0


def training_flops_per_token(params: float, cfg: ModelConfig) -> float:
    """≈ 6Ψ + 12·L·h·s (Chowdhery et al. 2022, appendix B)."""
    return 6 * params + 12 * cfg.layers * cfg.hidden * cfg.seq_len


def tp_comm_bytes_per_step(cfg: ModelConfig, micro_batch: int, tp: int, sequence_parallel: bool = False,
                           microbatches: int = 1, layers: int | None = None, first: bool = True, last: bool = True,
                           bytes_per_value: int = 4, recompute: str = "none") -> dict[str, float]:
    """Bytes (S, the full buffer, as nccl-tests counts) of the tensor-parallel collectives of one
    training step on one rank holding `layers` blocks (all by default), the embedding if `first`, the
    head and loss if `last` — from the operators our layers use:

    without sequence parallelism, each block: g after attn.proj and mlp.proj (forward), f before qkv
    and fc (backward) — 4 all-reduces of b·s·h; the embedding's g and the head's f one more each.
    With sequence parallelism they become reduce-scatters and all-gathers of the same b·s·h buffers,
    and each column layer gathers its input again in backward instead of keeping it (+1 all-gather);
    the gradients left partial (layer norms, positions, row biases) are all-reduced once per step.
    The loss adds three all-reduces of one value per token; the gradient norm one scalar per step.
    Full recomputation runs each block's forward twice, so its forward collectives twice.
    """
    if tp == 1:
        return {}
    s, b, h, w, m = cfg.seq_len, micro_batch, cfg.hidden, bytes_per_value, microbatches
    L = cfg.layers if layers is None else layers
    full = b * s * h * w
    loss = 3 * b * s * 4 if last else 0
    again = 2 * L if recompute == "full" else 0  # the forward's collectives of every block, rerun
    if not sequence_parallel:
        return {"all_reduce": m * ((4 * L + again + first + last) * full + loss) + 4}
    partial = L * 6 * h + (s * h if first else 0) + (2 * h if last else 0)
    return {"all_gather": m * (6 * L + again + first + 2 * last) * full,
            "reduce_scatter": m * (4 * L + again + first + last) * full,
            "all_reduce": m * loss + 4 * partial + 4}


# ---- a run's predictions, from its resolved config (what summary.json puts beside the measurement) ----

def predicted_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, float]:
    """The formulas' memory per rank for this run, by category: model states, activations, and the
    buffers ZeRO-2/3 stage and gather (`buffer_bytes`)."""
    model = run_model(config)
    precision = config.get("precision", "fp32")
    tp, sp = config.get("tp", 1), config.get("sequence_parallel", False)
    params = params_per_rank(model, tp, config.get("pp", 1), config.get("virtual_stages", 1), pp_rank)
    width = 4 if precision == "fp32" else 2
    states = {**model_state_bytes(params, config["dp"], config.get("zero", 0), precision),
              **buffer_bytes(model, params, config["dp"], config.get("zero", 0), config.get("bucket_mb", 25.0),
                             width, config.get("prefetch", True))}
    m = config.get("microbatches", 1)
    micro = config["global_batch"] // config["dp"] // m
    rc = config.get("recompute", "none")
    if config.get("pp", 1) == 1 and m == 1:
        return {**states, "activation": activation_bytes(model, micro, width, tp, sp, rc)}
    # pipelined: walk this rank's schedule, adding a microbatch's stage bytes at each forward and
    # releasing them at its backward; the peak is what the schedule makes the rank hold at once
    sched = run_schedule(config)
    stage_bytes = {k: stage_activation_bytes(model, micro, k, sched.stages, width, tp, sp, rc)
                   for k in range(sched.stages)}
    live = peak = 0.0
    for a in sched.actions[pp_rank]:
        if a.kind in ("F", "B"):
            live += stage_bytes[a.stage] if a.kind == "F" else -stage_bytes[a.stage]
            peak = max(peak, live)
    # with recomputation, one block's rerun sits on top during some backward (an upper bound here)
    transient = recompute_activation_bytes(model, micro, width, tp, sp, rc)[1]
    return {**states, "activation": peak + transient}


def run_schedule(config: dict[str, Any]) -> Schedule:
    """The microbatch schedule a run's config (config.json or a RunConfig's dict) executes."""
    pp = config.get("pp", 1)
    return build_schedule(config.get("schedule", "1f1b") if pp > 1 else "1f1b", pp, config.get("microbatches", 1),
                          config.get("virtual_stages", 1))


def predicted_comm_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, dict[str, float]]:
    """Bytes per step by op and group: the gradient all-reduce over dp (4 bytes per local parameter when
    dp > 1) and the loss's one value; the tensor-parallel collectives of the layers; and for pipelines
    the activations and gradients sent between stages (one b·s·h buffer per microbatch and boundary),
    the loss brought to every stage and the gradient norm's share."""
    model = run_model(config)
    dp, tp, pp = config["dp"], config.get("tp", 1), config.get("pp", 1)
    v, m, sp = config.get("virtual_stages", 1), config.get("microbatches", 1), config.get("sequence_parallel", False)
    local = params_per_rank(model, tp, pp, v, pp_rank)
    zero = config.get("zero", 0)
    if zero and dp > 1:  # gradients reduce-scattered, parameters all-gathered (twice for ZeRO-3)
        # ZeRO-2 never keeps a full gradient, so with accumulation every microbatch reduce-scatters
        scatters = m if zero == 2 else 1
        out: dict[str, dict[str, float]] = {"all_reduce": {"dp": 4 + 4}, "reduce_scatter": {"dp": 4 * local * scatters},
                                            "all_gather": {"dp": 4 * local * (2 if zero == 3 else 1)}}
    else:
        grad_width = 4 if config.get("precision", "fp32") == "fp32" else 2  # gradients in the model's precision
        out = {"all_reduce": {"dp": 4 + (grad_width * local if dp > 1 else 0)}}
    micro = config["global_batch"] // dp // m
    stages = pp * v
    mine = list(range(pp_rank, stages, pp))
    layers = model.layers // stages * len(mine)
    tp_bytes = tp_comm_bytes_per_step(model, micro, tp, sp, m, layers, 0 in mine, stages - 1 in mine,
                                               4 if config.get("precision", "fp32") == "fp32" else 2,
                                               config.get("recompute", "none"))
    for op, nbytes in tp_bytes.items():
        out.setdefault(op, {})["tp"] = nbytes
    if config.get("precision") == "fp16" and not zero:  # the overflow check: one flag, max over the world
        out["all_reduce"]["world"] = 4
    if pp > 1:
        width = 4 if config.get("precision", "fp32") == "fp32" else 2
        buffer = micro * model.seq_len // (tp if sp else 1) * model.hidden * width
        transfers = sum((k < stages - 1) + (k > 0) for k in mine) * m * buffer  # each way, per step
        out["send"] = {"pp": transfers}
        out["recv"] = {"pp": transfers}
        out["all_reduce"]["pp"] = 4 + 4  # the loss, and the gradient norm's squares
    return out


def run_model(config: dict[str, Any]) -> ModelConfig:
    """The model dimensions of a resolved config.json."""
    return ModelConfig(**{k: config["model"][k] for k in
                          ("vocab_size", "seq_len", "hidden", "heads", "layers", "mlp_ratio")})
