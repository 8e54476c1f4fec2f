"""Activations of *our* GPT, counted from its code the way Korthikanti et al. 2022 count Megatron's, with
recomputation and the release of each tensor as backward uses it. Plain arithmetic, no torch."""

from __future__ import annotations

from workbench.config import ModelConfig


def activation_bytes_per_layer(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                               sequence_parallel: bool = False, device: str = "cpu", core: str = "eager") -> float:
    """Bytes one transformer block of *our* GPT saves for backward, counted from its code the way
    Korthikanti et al. 2022 count Megatron's (34·sbh + 5·as²b for 16-bit activations with dropout):

        replicated across tp ranks   ln_1 input, ln_1 output, the residual after attention,
                                     ln_2 output                                  → 4·sbh values
        split by tp                  qkv output (q, k, v share it), attention output before the
                                     projection, fc output, GELU output          → (4 + 2r)·sbh/t
                                     softmax probabilities                        →   a·s²·b/t
        layer-norm mean and 1/σ      two per layer norm                           →   4·sb values

    (r = mlp_ratio, 4: 16·sbh in all at t = 1.) Sequence parallelism splits the replicated part and
    the layer-norm statistics t ways too, so everything is divided by t. On CUDA (`device='cuda'`) the
    layer norm keeps its statistics in fp32 whatever the activations' precision (`stats_width`). `core`
    says what the attention core keeps instead of the probabilities (`core_saved_bytes`); under context
    parallelism `cfg.seq_len` is each rank's s/cp tokens and the core is the ring.
    """
    s, b, h, r, t = cfg.seq_len, micro_batch, cfg.hidden, cfg.mlp_ratio, tp
    replicated, stats = 4 * s * b * h, 4 * s * b
    if sequence_parallel:
        replicated, stats = replicated / t, stats / t
    core_bytes = core_saved_bytes(cfg, micro_batch, bytes_per_value, tp, device, core)
    return bytes_per_value * (replicated + (4 + 2 * r) * s * b * h / t) + core_bytes + \
        stats_width(bytes_per_value, device) * stats


def core_saved_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1, device: str = "cpu",
                     core: str = "eager") -> float:
    """What the attention core saves for backward besides q, k and v (views of the qkv output), per layer:
    eager: the softmax probabilities, a·s²·b/t values; fused (sdpa, flash attention): its log-sum-exp
    (`lse_values`, fp32), and on CUDA the generator's seed and offset (`CUDA_RNG_STATE_BYTES`); ring
    (context parallelism, parallel/ring_attention.py): its log-sum-exp (a·s·b/t, fp32) and the merged
    output (s·b·h/t: a tensor of its own, the projection's input is a reshaped copy) — no s × s anything,
    whatever the sequence; allgather (the rotation that gathers every rank's K/V at once): the ring's, and
    the cp gathered K/V blocks (2·cp·s·b·h/t, cp given as `core="allgather:CP"`)."""
    s, b, h, a, t, w = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads, tp, bytes_per_value
    if core == "eager":
        return w * a * s * s * b / t
    if core == "fused":
        return 4 * lse_values(cfg, micro_batch, w, t, device) + (CUDA_RNG_STATE_BYTES if device == "cuda" else 0)
    ring = 4 * a * s * b / t + w * s * b * h / t
    if core.startswith("allgather:"):
        return ring + w * 2 * int(core.split(":")[1]) * s * b * h / t
    return ring


#: what CUDA's fused attention kernels (flash and memory-efficient) also save for backward, per call: the
#: dropout generator's seed and offset, two int64 scalars, kept even without dropout (measured on an H200,
#: torch 2.11: 16 bytes a layer beyond the log-sum-exp)
CUDA_RNG_STATE_BYTES = 16


def stats_width(bytes_per_value: int, device: str) -> int:
    """Bytes per layer-norm statistic (mean, 1/σ): the activations' own width on the CPU, fp32 on CUDA
    (its kernel accumulates and saves them in fp32)."""
    return 4 if device == "cuda" else bytes_per_value


def lse_values(cfg: ModelConfig, micro_batch: int, bytes_per_value: int, tp: int, device: str) -> float:
    """Values of the log-sum-exp the fused attention kernel keeps (fp32), per layer: a·s·b/t — flash
    attention's (CPU, and CUDA in 16 bits); CUDA's memory-efficient kernel (what fp32 gets there) pads the
    sequence to a multiple of 32."""
    s = cfg.seq_len
    if device == "cuda" and bytes_per_value == 4:
        s = -(-s // 32) * 32
    return cfg.heads * s * micro_batch / tp


def recompute_activation_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               device: str = "cpu", core: str = "eager") -> tuple[float, float]:
    """(bytes a block keeps after forward, bytes held on top while one block is recomputed in backward).

    full:       keeps only its input, s·b·h values (÷t with sequence parallelism) — Korthikanti's 2·sbh
                in 16-bit; the rerun of one block rebuilds everything else it saves.
    selective:  keeps all but the attention core's tensors: the softmax probabilities (a·s²·b/t) are
                dropped; rerunning the core rebuilds them, plus contiguous copies of q, k, v (3·sbh/t)
                that the batched matmuls save.
    fused:      attention='sdpa' (flash attention) without recomputation: no probabilities are saved, the
                kernel keeps its log-sum-exp instead (a·s·b/t values, fp32: `lse_values`) and recomputes the
                rest in its backward — measured equal on CPU (tests/test_models.py).
    With the ring core (context parallelism) selective drops the ring's output and log-sum-exp, and its rerun
    makes no copies of q, k, v.
    """
    s, b, h, t, w = cfg.seq_len, micro_batch, cfg.hidden, tp, bytes_per_value
    if recompute == "fused":
        return activation_bytes_per_layer(cfg, micro_batch, w, tp, sequence_parallel, device, "fused"), 0.0
    whole = activation_bytes_per_layer(cfg, micro_batch, bytes_per_value, tp, sequence_parallel, device, core)
    if recompute == "full":
        kept = w * s * b * h / (t if sequence_parallel else 1)
        return kept, whole - kept
    if recompute == "selective":
        saved = core_saved_bytes(cfg, micro_batch, w, tp, device, core)
        return whole - saved, saved + (w * 3 * s * b * h / t if core == "eager" else 0.0)
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
                          sequence_parallel: bool = False, device: str = "cpu") -> float:
    """What the last stage saves besides its blocks: the final layer norm's input, output (the head's
    input) and statistics, and the loss's saved tensors — the log-softmax output, targets and the
    total weight; or under tensor parallelism this rank's vocabulary slice of the softmax, the local
    targets and their mask."""
    s, b, h, v, t, w = cfg.seq_len, micro_batch, cfg.hidden, cfg.vocab_size, tp, bytes_per_value
    ln_f = w * 2 * s * b * h + stats_width(w, device) * 2 * s * b  # input, output; statistics
    # the loss runs in fp32 whatever the activations' precision: its saved softmax is 4 bytes a value
    if t == 1:
        return ln_f + 4 * s * b * v + 8 * s * b + 4
    split = t if sequence_parallel else 1
    return ln_f / split + 4 * s * b * v / t + 8 * s * b + s * b


def stage_activation_bytes(cfg: ModelConfig, micro_batch: int, stage: int, stages: int, bytes_per_value: int = 4,
                           tp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
                           device: str = "cpu", core: str = "eager") -> float:
    """Bytes one microbatch's forward leaves saved on pipeline stage `stage` of `stages`."""
    kept, _ = recompute_activation_bytes(cfg, micro_batch, bytes_per_value, tp, sequence_parallel, recompute, device,
                                         core)
    out = cfg.layers // stages * kept
    if stage == 0:
        out += embedding_activation_bytes(cfg, micro_batch, tp, sequence_parallel)
    if stage == stages - 1:
        out += head_activation_bytes(cfg, micro_batch, bytes_per_value, tp, sequence_parallel, device)
    return out


def backward_extra_bytes(cfg: ModelConfig, micro_batch: int, last: bool, bytes_per_value: int = 4, tp: int = 1,
                         sequence_parallel: bool = False, recompute: str = "none", device: str = "cpu",
                         core: str = "eager") -> float:
    """How far a stage's activations rise, during its backward, above what its forward left saved (0
    without recomputation: backward only releases). Backward releases each tensor once it has used it,
    so the rise happens at the stage's last block, after the head's tensors (last stage) are gone:

    full:       the last block's rerun saves everything the block saves (its input, released when the
                recompute node unpacks it, is saved again by the rerun): whole − kept on top.
    selective:  the core reruns after the MLP and the output projection released their tensors and the
                recompute node its q, k, v: ln_1's input, output and statistics remain, and the rerun
                adds the probabilities and the contiguous q, k, v copies its matmuls save.
    """
    if recompute in ("none", "fused"):
        return 0.0
    s, b, h, t, w = cfg.seq_len, micro_batch, cfg.hidden, tp, bytes_per_value
    kept, rise = recompute_activation_bytes(cfg, micro_batch, w, tp, sequence_parallel, recompute, device, core)
    if recompute == "full":
        during = rise
    else:  # ln_1's tensors, and the core's rerun: what it saves and the copies it makes
        split = t if sequence_parallel else 1
        ln_1 = w * 2 * s * b * h + stats_width(w, device) * 2 * s * b
        during = ln_1 / split + rise - kept
    head = head_activation_bytes(cfg, micro_batch, w, tp, sequence_parallel, device) if last else 0.0
    return max(0.0, during - head)


def activation_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1,
                     sequence_parallel: bool = False, recompute: str = "none", device: str = "cpu",
                     core: str = "eager") -> float:
    """Peak bytes saved for backward by one micro-batch through the whole model on one rank: what the
    forward keeps, or — with recomputation — more while the last block reruns (`backward_extra_bytes`).
    `device`: 'cuda' counts the CUDA kernels' own saves (fp32 layer-norm statistics, sdpa's padded
    log-sum-exp)."""
    kept = stage_activation_bytes(cfg, micro_batch, 0, 1, bytes_per_value, tp, sequence_parallel, recompute, device,
                                  core)
    return kept + backward_extra_bytes(cfg, micro_batch, True, bytes_per_value, tp, sequence_parallel, recompute,
                                       device, core)


def korthikanti_activation_bytes_per_layer(cfg: ModelConfig, micro_batch: int, tp: int = 1) -> float:
    """Megatron's 16-bit figure for comparison: s·b·h·(10 + 24/t + 5·a·s/(h·t))."""
    s, b, h, a = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
