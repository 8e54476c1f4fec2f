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
