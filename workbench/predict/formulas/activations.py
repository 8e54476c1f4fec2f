"""Activations of *our* GPT, counted from its code the way Korthikanti et al. 2022 count Megatron's, with
recomputation and the release of each tensor as backward uses it. Plain arithmetic, no torch."""

from __future__ import annotations

from workbench.config import ModelConfig


def activation_bytes_per_layer(
    cfg: ModelConfig,
    micro_batch: int,
    bytes_per_value: int = 4,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    device: str = "cpu",
    core: str = "eager",
) -> float:
    """Bytes one transformer block of *our* model saves for backward, counted from its code the way
    Korthikanti et al. 2022 count Megatron's (34·sbh + 5·as²b for 16-bit activations with dropout):

        replicated across tp ranks   ln_1 input, ln_1 output, the residual after attention,
                                     ln_2 output                                  → 4·sbh values
        split by tp                  q, k and v as the core keeps them (`qkv_saved_values`: 3·sbh/t for
                                     the eager core's copies), the attention output before the projection
                                     (sbh/t), the MLP's (`mlp_saved_values`: 2·sbf/t for GELU, 4·sbf/t for
                                     SwiGLU)
                                     softmax probabilities                        →   a·s²·b/t
        norm statistics              LayerNorm: mean and 1/σ, two per norm → 4·sb values; RMSNorm: 1/rms,
                                     one per norm in fp32 (model/llama.py) → 2·sb values of 4 bytes

    (GPT-2's f = 4h: 16·sbh in all at t = 1.) Sequence parallelism splits the replicated part and the
    statistics t ways too, so everything is divided by t. On CUDA (`device='cuda'`) the layer norm keeps its
    statistics in fp32 whatever the activations' precision (`stats_width`). `core` says what the attention
    core keeps instead of the probabilities (`core_saved_bytes`); under context parallelism `cfg.seq_len` is
    each rank's s/cp tokens and the core is the ring.
    """
    s, b, h, t, w = cfg.seq_len, micro_batch, cfg.hidden, tp, bytes_per_value
    replicated: float = 4 * s * b * h
    if sequence_parallel:
        replicated = replicated / t
    sharded = (qkv_saved_values(cfg, core) + h + mlp_saved_values(cfg)) * s * b / t
    return (
        w * (replicated + sharded)
        + core_saved_bytes(cfg, micro_batch, w, tp=tp, device=device, core=core)
        + norm_stats_bytes(
            cfg,
            micro_batch,
            bytes_per_value=w,
            tp=tp,
            sequence_parallel=sequence_parallel,
            device=device,
            norms=2,
        )
    )


def mlp_saved_values(cfg: ModelConfig) -> int:
    """Values per token the MLP saves (÷t under tensor parallelism): GELU its fc output and the GELU's
    (2f); SwiGLU the fused gate-and-up output (2f: silu's gate and the product's up are views of it), silu's
    output and the product (4f)."""
    return 4 * cfg.inner if cfg.mlp == "swiglu" else 2 * cfg.inner


def norm_stats_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    *,
    bytes_per_value: int,
    tp: int,
    sequence_parallel: bool,
    device: str,
    norms: int,
) -> float:
    """The statistics `norms` norms keep a token: LayerNorm mean and 1/σ (`stats_width` each), RMSNorm 1/rms
    (fp32 on every device: model/llama.RMSNormFunction) — split t ways with sequence parallelism."""
    per = 4 if cfg.norm == "rmsnorm" else 2 * stats_width(bytes_per_value, device)
    return norms * per * cfg.seq_len * micro_batch / (tp if sequence_parallel else 1)


def qkv_tensors(cfg: ModelConfig, saver: str) -> dict[str, int]:
    """The tensors holding q, k and v that `saver` keeps, name → values per token (÷t), so that two savers
    keeping the same tensor count it once:

        eager       its batched matmuls' contiguous copies of q, k and v: 3h
        fused       sdpa keeps its inputs: q (rotated: a tensor of h; else a view of the projection's output
                    `qkv`, whose whole h + 2·kv_dim counts), k and v expanded to every query head (grouped
                    queries: h each; else k rotated, kv_dim, or a view; v a view)
        ring, node  the ring (and selective recomputation's node, which keeps the core's inputs) keep q, k
                    and v before expansion: q, k rotated or views, v a view
        allgather   the gathering core keeps q only (its gathered K/V blocks count in `core_saved_bytes`)
    """
    h, qkv = cfg.hidden, cfg.qkv_width
    if saver == "eager":
        return {"q copy": h, "k copy": h, "v copy": h}
    rope, grouped = cfg.positions == "rope", cfg.kv < cfg.heads
    q = {"q rotated": h} if rope else {"qkv": qkv}
    k = {"k rotated": cfg.kv_dim} if rope else {"qkv": qkv}
    if saver == "allgather":
        return q
    if saver == "fused" and grouped:
        return {**q, "k expanded": h, "v expanded": h}
    return {**q, **k, "qkv": qkv}


def qkv_saved_values(cfg: ModelConfig, core: str) -> int:
    """Values per token (÷t) of the tensors holding q, k and v that attention core `core` keeps."""
    return sum(qkv_tensors(cfg, core.split(":")[0]).values())


def core_saved_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    bytes_per_value: int = 4,
    *,
    tp: int = 1,
    device: str = "cpu",
    core: str = "eager",
) -> float:
    """What the attention core saves for backward besides q, k and v (`qkv_tensors`), per layer:
    eager: the softmax probabilities, a·s²·b/t values; fused (sdpa, flash attention): its log-sum-exp
    (`lse_values`, fp32; its output, laid out (b, s, heads, d), is the projection's input itself), and on CUDA
    the generator's seed and offset (`CUDA_RNG_STATE_BYTES`);
    ring (context parallelism, parallel/ring_attention.py): its log-sum-exp (a·s·b/t, fp32) and the merged
    output (s·b·h/t: a tensor of its own, the projection's input is a reshaped copy) — no s × s anything,
    whatever the sequence; allgather (the rotation that gathers every rank's K/V at once): the ring's, and
    the cp gathered K/V blocks (2·cp·s·b·kv_dim/t, cp given as `core="allgather:CP"`)."""
    s, b, h, a, t, w = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads, tp, bytes_per_value
    if core == "eager":
        return w * a * s * s * b / t
    if core == "fused":
        return 4 * lse_values(cfg, micro_batch, w, t, device) + (
            CUDA_RNG_STATE_BYTES if device == "cuda" else 0
        )
    ring = 4 * a * s * b / t + w * s * b * h / t
    if core.startswith("allgather:"):
        return ring + w * 2 * int(core.split(":")[1]) * s * b * cfg.kv_dim / t
    return ring


#: what CUDA's fused attention kernels (flash and memory-efficient) also save for backward, per call: the
#: dropout generator's seed and offset, two int64 scalars, kept even without dropout (measured on an H200,
#: torch 2.11: 16 bytes a layer beyond the log-sum-exp)
CUDA_RNG_STATE_BYTES = 16


def stats_width(bytes_per_value: int, device: str) -> int:
    """Bytes per layer-norm statistic (mean, 1/σ): the activations' own width on the CPU, fp32 on CUDA
    (its kernel accumulates and saves them in fp32)."""
    return 4 if device == "cuda" else bytes_per_value


def lse_values(
    cfg: ModelConfig, micro_batch: int, bytes_per_value: int, tp: int, device: str
) -> float:
    """Values of the log-sum-exp the fused attention kernel keeps (fp32), per layer: a·s·b/t — flash
    attention's (CPU, and CUDA in 16 bits); CUDA's memory-efficient kernel (what fp32 gets there) pads the
    sequence to a multiple of 32."""
    s = cfg.seq_len
    if device == "cuda" and bytes_per_value == 4:
        s = -(-s // 32) * 32
    return cfg.heads * s * micro_batch / tp


def recompute_activation_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    bytes_per_value: int = 4,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    device: str = "cpu",
    core: str = "eager",
) -> tuple[float, float]:
    """(bytes a block keeps after forward, bytes held on top while one block is recomputed in backward).

    full:       keeps only its input, s·b·h values (÷t with sequence parallelism) — Korthikanti's 2·sbh
                in 16-bit; the rerun of one block rebuilds everything else it saves.
    selective:  keeps all but the attention core's tensors: the softmax probabilities (a·s²·b/t) and the
                core's q, k, v are dropped, the node keeps the core's inputs instead (`qkv_tensors`: 'node');
                rerunning the core rebuilds what it saves — with the eager core the contiguous copies of
                q, k, v (3·sbh/t) its batched matmuls save.
    fused:      attention='sdpa' (flash attention) without recomputation: no probabilities are saved, the
                kernel keeps its log-sum-exp instead (a·s·b/t values, fp32: `lse_values`) and recomputes the
                rest in its backward — measured equal on CPU (tests/test_models.py).
    With the ring core (context parallelism) selective drops the ring's output and log-sum-exp, and its rerun
    makes no copies of q, k, v.
    """
    s, b, h, t, w = cfg.seq_len, micro_batch, cfg.hidden, tp, bytes_per_value
    if recompute == "fused":
        return activation_bytes_per_layer(
            cfg,
            micro_batch,
            w,
            tp=tp,
            sequence_parallel=sequence_parallel,
            device=device,
            core="fused",
        ), 0.0
    whole = activation_bytes_per_layer(
        cfg, micro_batch, w, tp=tp, sequence_parallel=sequence_parallel, device=device, core=core
    )
    if recompute == "full":
        kept = w * s * b * h / (t if sequence_parallel else 1)
        return kept, whole - kept
    if recompute == "selective":
        core_qkv, node_qkv = qkv_tensors(cfg, core.split(":")[0]), qkv_tensors(cfg, "node")
        saved = core_saved_bytes(cfg, micro_batch, w, tp=tp, device=device, core=core)
        dropped = saved + w * s * b * (sum(core_qkv.values()) - sum(node_qkv.values())) / t
        rebuilt = (
            saved + w * s * b * sum(v for name, v in core_qkv.items() if name not in node_qkv) / t
        )
        return whole - dropped, rebuilt
    return whole, 0.0


def embedding_activation_bytes(
    cfg: ModelConfig, micro_batch: int, tp: int = 1, sequence_parallel: bool = False
) -> float:
    """What the first stage saves besides its blocks: token ids (int64) for the embedding lookup,
    positions (learned positions only: rotary ones are tables, not activations), and under tensor
    parallelism the mask of tokens outside this rank's vocabulary slice."""
    s, b = cfg.seq_len, micro_batch
    positions = 8 * s if cfg.positions == "learned" else 0
    if tp == 1:
        return 8 * s * b + positions
    return 8 * s * b + s * b + positions / (tp if sequence_parallel else 1)


def head_activation_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    bytes_per_value: int = 4,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    device: str = "cpu",
) -> float:
    """What the last stage saves besides its blocks: the final layer norm's input, output (the head's
    input) and statistics, and the loss's saved tensors (model/cross_entropy.py) — the logits in the
    activations' dtype, the targets and the fp32 log-sum-exp of each row; or under tensor parallelism this
    rank's vocabulary slice of the logits, the local targets, their mask and the log-sum-exp."""
    s, b, h, v, t, w = cfg.seq_len, micro_batch, cfg.hidden, cfg.vocab_size, tp, bytes_per_value
    # in, out; stats
    ln_f = w * 2 * s * b * h + norm_stats_bytes(
        cfg, micro_batch, bytes_per_value=w, tp=1, sequence_parallel=False, device=device, norms=1
    )
    if t == 1:
        return ln_f + w * s * b * v + 8 * s * b + 4 * s * b
    split = t if sequence_parallel else 1
    return ln_f / split + w * s * b * v / t + 8 * s * b + s * b + 4 * s * b


#: model/cross_entropy.py's BLOCK_BYTES (tests/test_cross_entropy.py holds the two equal): the loss's fp32 block
LOSS_BLOCK_BYTES = 64 * 2**20


def loss_bytes(cfg: ModelConfig, micro_batch: int, bytes_per_value: int = 4, tp: int = 1) -> float:
    """The `loss` category at its peak (model/cross_entropy.py), at the start of the loss's backward, when every
    other activation is still held: the logits (b·s·V/t values in the activations' dtype: unpacked, so no longer
    counted as activations, but alive until the loss's backward returns), their gradient in the same dtype, and the
    first block's fp32 temporaries — its copy (16-bit logits only) and its probabilities. The last pipeline
    stage's only."""
    s, b, v, w = cfg.seq_len, micro_batch, cfg.vocab_size // tp, bytes_per_value
    rows = s * b
    block_rows = min(rows, max(1, LOSS_BLOCK_BYTES // (4 * v)))
    return 2 * w * rows * v + (2 if w < 4 else 1) * 4 * block_rows * v


def stage_activation_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    *,
    stage: int,
    stages: int,
    bytes_per_value: int = 4,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    device: str = "cpu",
    core: str = "eager",
) -> float:
    """Bytes one microbatch's forward leaves saved on pipeline stage `stage` of `stages`."""
    kept, _ = recompute_activation_bytes(
        cfg,
        micro_batch,
        bytes_per_value,
        tp=tp,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        device=device,
        core=core,
    )
    out = cfg.layers // stages * kept
    if stage == 0:
        out += embedding_activation_bytes(cfg, micro_batch, tp, sequence_parallel)
    if stage == stages - 1:
        out += head_activation_bytes(
            cfg,
            micro_batch,
            bytes_per_value,
            tp=tp,
            sequence_parallel=sequence_parallel,
            device=device,
        )
    return out


def backward_extra_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    *,
    last: bool,
    bytes_per_value: int = 4,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    device: str = "cpu",
    core: str = "eager",
) -> float:
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
    kept, rise = recompute_activation_bytes(
        cfg,
        micro_batch,
        w,
        tp=tp,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        device=device,
        core=core,
    )
    if recompute == "full":
        during = rise
    else:  # ln_1's tensors, and the core's rerun: what it saves and the copies it makes
        split = t if sequence_parallel else 1
        ln_1 = w * 2 * s * b * h + norm_stats_bytes(
            cfg,
            micro_batch,
            bytes_per_value=w,
            tp=1,
            sequence_parallel=False,
            device=device,
            norms=1,
        )
        during = ln_1 / split + rise - kept
    head = (
        head_activation_bytes(
            cfg, micro_batch, w, tp=tp, sequence_parallel=sequence_parallel, device=device
        )
        if last
        else 0.0
    )
    return max(0.0, during - head)


def activation_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    bytes_per_value: int = 4,
    *,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    device: str = "cpu",
    core: str = "eager",
) -> float:
    """Peak bytes saved for backward by one micro-batch through the whole model on one rank: what the
    forward keeps, or — with recomputation — more while the last block reruns (`backward_extra_bytes`).
    `device`: 'cuda' counts the CUDA kernels' own saves (fp32 layer-norm statistics, sdpa's padded
    log-sum-exp)."""
    kept = stage_activation_bytes(
        cfg,
        micro_batch,
        stage=0,
        stages=1,
        bytes_per_value=bytes_per_value,
        tp=tp,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        device=device,
        core=core,
    )
    return kept + backward_extra_bytes(
        cfg,
        micro_batch,
        last=True,
        bytes_per_value=bytes_per_value,
        tp=tp,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        device=device,
        core=core,
    )


def korthikanti_activation_bytes_per_layer(
    cfg: ModelConfig, micro_batch: int, tp: int = 1
) -> float:
    """Megatron's 16-bit figure for comparison: s·b·h·(10 + 24/t + 5·a·s/(h·t))."""
    s, b, h, a = cfg.seq_len, micro_batch, cfg.hidden, cfg.heads
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))
