"""Mixture of experts and expert parallelism (model/moe.py, parallel/expert_parallel.py): the bytes of the
dispatch and of the gradients, and expert memory ÷ ep. Plain arithmetic, no torch.

Sources: GShard (Lepikhin et al. 2020) and Switch (Fedus et al. 2021) for top-k routing, capacity and the
auxiliary loss; DeepSpeed-MoE for the equal-split (capacity) all-to-all; torchtitan's and Megatron-LM's
dropless token dispatchers. Symbols: T tokens of a rank's microbatch (b·s), k experts per token, E experts,
ep the expert-parallel degree, h hidden, w bytes per activation value, F the capacity factor.
"""

from __future__ import annotations

import math
from typing import Any

from workbench.config import ModelConfig


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """C = ⌈F·T·k/E⌉ rows per expert from one rank (model/moe.MoE.capacity)."""
    return max(1, math.ceil(factor * tokens * top_k / experts))


def expert_params_per_layer(cfg: ModelConfig) -> int:
    """One expert MLP's parameters (fc — SwiGLU's gate and up — and proj, weights and biases) times E: what
    ep shards."""
    return cfg.experts * cfg.mlp_params()


def dispatch_bytes_per_layer(
    tokens: int,
    cfg: ModelConfig,
    ep: int,
    *,
    width: int = 4,
    dispatch: str = "dropless",
    factor: float = 1.25,
) -> dict[str, float]:
    """Bytes (each all-to-all's input, S as nccl-tests counts it) of one MoE layer and microbatch on one rank:
    four all-to-alls of rows of h values — dispatch and combine in forward, the same two carrying gradients in
    backward. capacity: each carries E·C rows (padded). dropless: the dispatch sends the T·k assignments, the
    combine what this rank's experts received — T·k on average over the ep ranks, exact only in their sum —,
    plus the E per-expert counts (int64) exchanged first."""
    if ep == 1:
        return {}
    row = cfg.hidden * width
    if dispatch == "capacity":
        return {
            "all_to_all": 4 * cfg.experts * capacity(tokens, cfg.top_k, cfg.experts, factor) * row
        }
    return {"all_to_all": 4 * tokens * cfg.top_k * row + 8 * cfg.experts}


def moe_comm_bytes(
    out: dict[str, dict[str, float]],
    config: dict[str, Any],
    model: ModelConfig,
    *,
    micro: int,
    layers: int,
    wire: int,
    microbatches: int | None = None,
) -> None:
    """Into `out` (formulas.predicted_comm_bytes's dict): the gradient all-reduce split — dense parameters
    over dp, experts over edp (the ranks holding the same ones, dp/ep of them) —, the expert gradient norm's
    sum over ep, the counts all-reduced over dp (E per layer and microbatch, fp32), and the dispatch.
    `microbatches`: those each of the rank's `layers` runs (the config's, unless DualPipe's half)."""
    dp, ep = config["dp"], config.get("ep", 1)
    m = config.get("microbatches", 1) if microbatches is None else microbatches
    if dp > 1:
        out["all_reduce"]["dp"] = out["all_reduce"].get("dp", 0.0) + 4 * model.experts * layers * m
    if ep == 1:
        return
    experts_local = expert_params_per_layer(model) // ep * layers
    out["all_reduce"]["dp"] -= wire * experts_local  # the experts are not reduced over all of dp
    if dp // ep > 1:
        out["all_reduce"]["edp"] = wire * experts_local
    out["all_reduce"]["ep"] = 4
    tokens = micro * model.seq_len
    for op, nbytes in dispatch_bytes_per_layer(
        tokens,
        model,
        ep,
        width=4 if config.get("precision", "fp32") == "fp32" else 2,
        dispatch=config.get("moe_dispatch", "dropless"),
        factor=config.get("capacity_factor", 1.25),
    ).items():
        out.setdefault(op, {})["ep"] = nbytes * layers * m


def expert_imbalance(counts: list[float], ep: int) -> float:
    """From measured router counts (tokens per expert, E of them): the busiest ep rank's tokens over the mean
    rank's — how much longer the experts' compute (and the combine's wait) takes than under perfect balance.
    Rank i holds experts [i·E/ep, (i+1)·E/ep)."""
    per = len(counts) // ep
    loads = [sum(counts[i * per : (i + 1) * per]) for i in range(ep)]
    mean = sum(loads) / ep
    return max(loads) / mean if mean else 1.0
