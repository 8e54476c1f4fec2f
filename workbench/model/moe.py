"""A mixture-of-experts MLP (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021),
part of the model when `ModelConfig.experts` > 0: every block's MLP becomes E expert MLPs and a router.

    x (T tokens) ─ router (fp32): scores = softmax | sigmoid(x·Wᵣᵀ), top-k experts per token, gates
      ─ permute: the T·k (token, expert) assignments in expert-major order (capacity: at most C per expert)
      ─ dispatch → each expert's MLP on its rows → combine (engine: local; parallel/expert_parallel.py: the
        all-to-alls of expert parallelism)
      ─ unpermute: each token's output is the gate-weighted sum of its experts' outputs

**Gates.** softmax: the top-k probabilities, renormalised to sum to 1 when k > 1 (Mixtral; top-1 keeps the
probability, as Switch does, so the router learns from the main loss); sigmoid: the top-k scores,
renormalised (DeepSeek-V3).

**Capacity.** `capacity_factor` F > 0 gives each expert C = ⌈F·T·k/E⌉ slots of this rank's tokens; the
assignments beyond C (in token order) are dropped — the token keeps only its residual — and counted. F = 0
is dropless.

**Auxiliary loss** (Switch/GShard): coef · E · Σₑ fₑ·Pₑ, fₑ the share of assignments to expert e and Pₑ
the mean router probability of e. f is counted over the whole data-parallel batch (an all-reduce of E
counts, by the `MoEState`), P over this rank's tokens; since P's mean over ranks is the batch's, the ranks'
average gradient is the whole batch's, as in one process. Uniform routing gives exactly `coef`. Its
gradient joins backward at the layer's output (Megatron's MoEAuxLossAutoScaler): the loss reported is the
language-model loss alone.

**Aux-loss-free balance** (DeepSeek-V3; torchtitan's `load_balance_coeff`): a per-expert bias added to the
scores for choosing the top-k only, nudged after each step by `bias_rate`·sign(mean count − count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.config import ModelConfig
from workbench.model.llama import swiglu


class GroupedLinear(nn.Module):
    """E linears stacked (weight (E, out, in), bias (E, out) where the model has biases); rows in expert-major
    order, `counts` per expert (expert parallelism cuts them: parallel/expert_parallel.ExpertShard)."""

    def __init__(
        self, experts: int, in_features: int, out_features: int, bias: bool = True
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(experts, out_features)) if bias else None

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # every expert runs, on zero rows if none came: each weight always gets a (zero) gradient
        return torch.cat(
            [
                F.linear(part, self.weight[e], None if self.bias is None else self.bias[e])
                for e, part in enumerate(x.split(counts))
            ]
        )


class Experts(nn.Module):
    """The expert MLPs on rows grouped by expert: fc → GELU → proj, or (SwiGLU, Mixtral's experts) fc as gate
    and up fused → silu(gate)·up → proj."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.fc = GroupedLinear(cfg.experts, cfg.hidden, cfg.mlp_in_width, cfg.bias)
        self.proj = GroupedLinear(cfg.experts, cfg.inner, cfg.hidden, cfg.bias)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        inner = self.fc(x, counts)
        return self.proj(swiglu(inner) if self.swiglu else F.gelu(inner), counts)


@dataclass(kw_only=True)
class MoEState:
    """What the MoE layers of one rank share, built by engine/parallelize.py and handed to each layer:
    the aux loss's coefficient and gradient scale (the step's loss scale ÷ microbatches, set each step),
    the bias rate, the capacity factor, the counts' all-reduce (None: one process), and this step's tokens
    per expert and drops per layer."""

    aux_coef: float = 0.0
    bias_rate: float = 0.0
    capacity_factor: float = 0.0
    grad_scale: float = 1.0
    all_reduce: Any = None  # fn(tensor) summing over the data-parallel ranks
    dispatcher: Any = None  # parallel/expert_parallel.ExpertParallel, or None: every expert here
    # layer → tokens per expert (whole batch)
    counts: dict[str, torch.Tensor] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)


class _AuxGrad(torch.autograd.Function):
    """Identity on the layer's output; backward also sends `scale` into the aux loss."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale, ctx.aux_shape = scale, aux.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return grad, torch.full(ctx.aux_shape, ctx.scale, device=grad.device), None


def expert_order(chosen: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (token, slot) assignments of `chosen` (T, k), flattened, in expert-major order — within an expert,
    token order — and the count per expert. Row i of the permuted tokens is token order[i] // k."""
    flat = chosen.reshape(-1)
    return flat.argsort(stable=True), torch.bincount(flat, minlength=experts)


def switch_aux_loss(counts: torch.Tensor, scores: torch.Tensor, coef: float) -> torch.Tensor:
    """coef · E · Σₑ fₑ·Pₑ: fₑ the share of assignments to expert e (`counts`, the whole batch's), Pₑ the mean
    score of e over these tokens (Switch's eq. 4; GShard's with top-k counts). Uniform routing: coef."""
    return coef * scores.size(-1) * (counts / counts.sum() * scores.mean(0)).sum()


class MoE(nn.Module):
    """The mixture-of-experts MLP of one block (module docstring)."""

    #: a buffer (register_buffer): aux-loss-free balancing's per-expert bias
    expert_bias: torch.Tensor

    def __init__(self, cfg: ModelConfig, name: str = "", *, state: MoEState | None = None) -> None:
        """`state`: what the rank's MoE layers share (engine/parallelize.py's; None: this layer's own)."""
        super().__init__()
        self.name, self.k, self.kind, self.n_experts = name, cfg.top_k, cfg.router, cfg.experts
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = Experts(cfg)
        self.register_buffer("expert_bias", torch.zeros(cfg.experts), persistent=False)
        self.state = MoEState() if state is None else state

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scores (T, E), chosen experts (T, k), gates (T, k)), all fp32."""
        logits = F.linear(x.float(), self.router.weight.float())
        scores = logits.softmax(-1) if self.kind == "softmax" else logits.sigmoid()
        chosen = (scores.detach() + self.expert_bias).topk(self.k, dim=-1).indices
        gates = scores.gather(-1, chosen)
        if self.kind == "sigmoid" or self.k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        return scores, chosen, gates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        scores, chosen, gates = self.route(tokens)
        order, counts = expert_order(chosen, self.n_experts)
        kept_counts, cap = counts, self.capacity(chosen.numel())
        if cap is not None:
            flat = chosen.reshape(-1)
            order = order[self._kept(flat[order], counts, cap)]
            kept_counts = torch.bincount(flat[order], minlength=self.n_experts)
        token_of = order // self.k  # the token each kept assignment came from
        rows = tokens[token_of]
        if self.state.dispatcher is None:
            out_rows = self.experts(rows, kept_counts.tolist())
        else:
            out_rows = self.state.dispatcher.run(self.name, rows, kept_counts, self.experts, cap)
        weighted = out_rows * gates.reshape(-1)[order].unsqueeze(-1).to(out_rows.dtype)
        out = torch.zeros_like(tokens).index_add_(0, token_of, weighted)
        out = self._with_aux(out, scores, counts)
        return out.view(b, s, h)

    def capacity(self, assignments: int) -> int | None:
        """C = ⌈F·T·k/E⌉ slots per expert for this rank's T·k assignments (None: dropless)."""
        if self.state.capacity_factor <= 0:
            return None
        return max(1, math.ceil(self.state.capacity_factor * assignments / self.n_experts))

    def _kept(self, sorted_experts: torch.Tensor, counts: torch.Tensor, cap: int) -> torch.Tensor:
        """Which of the expert-major assignments fit their expert's capacity (counted: the drops)."""
        start = torch.cumsum(counts, 0) - counts
        place = torch.arange(sorted_experts.numel(), device=counts.device) - start[sorted_experts]
        keep = place < cap
        self.state.dropped[self.name] = int((~keep).sum())
        return keep

    def _with_aux(
        self, out: torch.Tensor, scores: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """Count tokens per expert over the whole batch; attach the aux loss's gradient to the output."""
        total = counts.detach().float()
        if self.state.all_reduce is not None:
            total = self.state.all_reduce(total.clone(), self.name)
        self.state.counts[self.name] = self.state.counts.get(self.name, 0) + total
        if self.state.aux_coef <= 0 or not torch.is_grad_enabled():
            return out
        aux = switch_aux_loss(total, scores, self.state.aux_coef)
        return _AuxGrad.apply(out, aux, self.state.grad_scale)

    @torch.no_grad()
    def update_bias(self) -> None:
        """Aux-loss-free balancing, after the step: raise the bias of under-loaded experts, lower the others'."""
        counts = self.state.counts.get(self.name)
        if self.state.bias_rate > 0 and counts is not None:
            self.expert_bias += self.state.bias_rate * torch.sign(counts.mean() - counts)


def start_step(state: MoEState, grad_scale: float) -> None:
    """Before a step's forwards: counts and drops start from zero; the aux loss's gradient scale."""
    state.counts, state.dropped, state.grad_scale = {}, {}, grad_scale


def end_step(state: MoEState, model: nn.Module) -> dict[str, Any]:
    """After the update: the aux-loss-free bias nudged; the step's tokens per expert (whole batch, by layer)
    and dropped assignments (this rank's), for metrics.jsonl."""
    for module in model.modules():
        if isinstance(module, MoE):
            module.update_bias()
    return {
        "tokens_per_expert": {k: [int(x) for x in v.tolist()] for k, v in state.counts.items()},
        "dropped_tokens": sum(state.dropped.values()),
    }
