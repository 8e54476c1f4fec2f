"""Model FLOPs per token, and the utilisation they give a measured speed (MFU). Plain arithmetic, no torch.

Counted as nanoGPT, torchtitan and the PaLM paper (Chowdhery et al. 2022, appendix B) count them:

    FLOPs per token = 6 · N + 12 · L · s · h

    N      the parameters a token's matmuls multiply by: Ψ less the embeddings' lookups (the token table V·h
           and the positions s·h gather rows, they multiply nothing) — the head is a matmul and counts, tied
           to the table or not (SwiGLU's three matrices and grouped-query attention's narrower K/V are in Ψ);
           a mixture of experts counts only the k experts a token is routed to (and the router), not all E
    6      2 FLOPs a multiply-add, forward once and backward twice (the input's and the weight's gradients)
    12·L·s·h  attention's scores and weighted sum (q·kᵀ and p·v: 2·2·s·h a token a layer, ×3 for the
           backward), as if no position were masked — the convention, so MFUs compare across codebases

Recomputation's extra forward is not useful work and is not counted (that would be hardware FLOPs, HFU).
MFU = FLOPs per token × tokens/s ÷ (the devices' dense peak × their number): measure/peaks in
predict/hardware.py.
"""

from __future__ import annotations

from workbench.config.model_config import ModelConfig


def active_params(cfg: ModelConfig) -> int:
    """N: Ψ without the embedding lookups (V·h tokens, s·h positions), and of a mixture of experts only the
    k experts a token visits: (E − k) expert MLPs a layer are left out."""
    idle_experts = max(cfg.experts - cfg.top_k, 0) if cfg.experts else 0
    # tied: Ψ counted it once, as the table
    head = cfg.hidden * cfg.vocab_size if cfg.tie_embeddings else 0
    return (
        cfg.param_count()
        - cfg.embedding_params()
        + head
        - cfg.layers * idle_experts * cfg.mlp_params()
    )


def model_flops_per_token(cfg: ModelConfig) -> float:
    """6·N + 12·L·s·h: a training step's useful FLOPs per token (see the module's docstring)."""
    return 6 * active_params(cfg) + 12 * cfg.layers * cfg.seq_len * cfg.hidden


def mfu(cfg: ModelConfig, tokens_per_s: float, peak_flops: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: the model's FLOPs at this speed over `devices` × `peak_flops` (dense)."""
    return model_flops_per_token(cfg) * tokens_per_s / (peak_flops * devices)
