"""The analytic predictions the workbench puts beside every measurement (../shared/formulas.md).

Plain arithmetic, no torch: the notebooks, the summary writer and the estimator all call these.
Symbols: Ψ parameters, N data-parallel degree, p stages, m microbatches, v chunks per rank,
s sequence length, b microbatch size, h hidden size, a heads, L layers, V vocabulary.
"""

from __future__ import annotations

from workbench.config import ModelConfig

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


def activation_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                     sequence_parallel: bool = False) -> float:
    """All bytes saved for backward by one forward of a micro-batch on one rank: the L blocks plus
    the ends — token ids for the embedding, the final layer norm's input and output, the loss's
    saved tensors (log-softmax output, or under tensor parallelism the vocabulary slice of the
    softmax, targets and masks)."""
    s, b, h, v, t = cfg.seq_len, micro_batch, cfg.hidden, cfg.vocab_size, tp
    w = bytes_per_value
    if t == 1:
        ends = (w * (2 * s * b * h + 2 * s * b)  # ln_f input, its output (the head's input), mean, 1/σ
                + w * s * b * v  # log-softmax output
                + 8 * s * b * 2 + 8 * s  # token ids, targets, positions (int64)
                + 4)  # the cross-entropy's total weight (a scalar)
    else:
        split = t if sequence_parallel else 1
        ends = (w * (2 * s * b * h + 2 * s * b) / split  # ln_f input, output, statistics
                + w * s * b * v / t  # this rank's vocabulary slice of the softmax
                + 8 * s * b * 2 + 8 * s / split  # local token ids, local targets, positions (int64)
                + 2 * s * b)  # two boolean masks: tokens outside this rank's vocabulary slice
    return cfg.layers * activation_bytes_per_layer(cfg, micro_batch, bytes_per_value, tp, sequence_parallel) + ends


def params_per_rank(cfg: ModelConfig, tp: int = 1) -> int:
    """Parameters one tensor-parallel rank holds: the split ones divided by t, plus the replicated
    ones whole (position embeddings, layer norms, row-parallel biases)."""
    h, v, s, r, t = cfg.hidden, cfg.vocab_size, cfg.seq_len, cfg.mlp_ratio, tp
    split = v * h + cfg.layers * (3 * h * h + 3 * h + h * h + r * h * h + r * h + r * h * h) + h * v + v
    replicated = s * h + cfg.layers * (4 * h + 2 * h) + 2 * h
    return split // t + replicated


def korthikanti_activation_bytes_per_layer(cfg: ModelConfig, micro_batch: int, tp: int = 1) -> float:
    """Megatron's 16-bit figure for comparison: s·b·h·(10 + 24/t + 5·a·s/(h·t))."""
    s, b, h, a = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of a pipeline step with equal stage times: (p−1)/(v·m + p−1); v=1 is GPipe/1F1B."""
    return (p - 1) / (v * m + p - 1)


def ring_bytes_sent(nbytes: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of `nbytes`: 2(n−1)·S/n."""
    return 2 * (n - 1) * nbytes / n if n > 1 else 0.0


def dp_bytes_per_step(params: float, dp: int, zero: int = 0, grad_bytes: int = 4) -> float:
    """Gradient-synchronisation bytes each rank sends per step (ring algorithm): 2Ψ·(n−1)/n values
    for plain DP and ZeRO-1/2, 3Ψ·(n−1)/n for ZeRO-3 (parameters gathered twice)."""
    factor = 3 if zero >= 3 else 2
    return factor * (dp - 1) / dp * params * grad_bytes if dp > 1 else 0.0


def training_flops_per_token(params: float, cfg: ModelConfig) -> float:
    """≈ 6Ψ + 12·L·h·s (Chowdhery et al. 2022, appendix B)."""
    return 6 * params + 12 * cfg.layers * cfg.hidden * cfg.seq_len


def tp_comm_bytes_per_step(cfg: ModelConfig, batch: int, tp: int, sequence_parallel: bool = False,
                           bytes_per_value: int = 4) -> dict[str, float]:
    """Bytes (S, the full buffer, as nccl-tests counts) of the tensor-parallel collectives of one
    training step on one rank, by operation — from the operators our layers use:

    without sequence parallelism, each block: g after attn.proj and mlp.proj (forward), f before
    qkv and fc (backward) — 4 all-reduces of b·s·h; plus the embedding's g and the head's f;
    with sequence parallelism the all-reduces become all-gathers and reduce-scatters of the same
    b·s·h buffers (and the column layers gather their input again in backward instead of keeping it).
    The loss adds three all-reduces of one value per token; the gradient norm one scalar.
    """
    if tp == 1:
        return {}
    s, b, h, L, w = cfg.seq_len, batch, cfg.hidden, cfg.layers, bytes_per_value
    full = b * s * h * w
    loss = 3 * b * s * 4 + 4
    if not sequence_parallel:
        return {"all_reduce": (4 * L + 2) * full + loss}
    partial_params = L * 6 * h + 2 * h + s * h  # layer norms, row-parallel biases, ln_f, positions
    return {"all_gather": (6 * L + 3) * full, "reduce_scatter": (4 * L + 2) * full,
            "all_reduce": loss + partial_params * 4}
