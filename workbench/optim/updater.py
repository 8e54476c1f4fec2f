"""The contract of the optimizer step: an `Updater` turns synchronised gradients into new parameters.

    step(lr, max_norm)   the norm of the *whole* model's gradient (every shard, every stage), clipping
                         as torch.nn.utils.clip_grad_norm_ does (coefficient max_norm / (norm + 1e-6),
                         at most 1), then AdamW. Returns the norm — a 0-d tensor on the device, not read
                         (the training step reads it with the loss, once: engine/train_step.py), or a float —
                         or None when the step was skipped before a norm existed (an fp16 overflow). A norm
                         that is inf or NaN is a gradient anomaly: the update is skipped (every rank holds
                         the same global norm, so every rank skips the same step) — on CUDA inside the fused
                         kernel, without the host looking (parallel/adamw.apply_update).
    state_tensors()      what the `optimizer_state` memory category holds (Adam's moments, fp32 masters)
    counter_tensors()    Adam's per-tensor step counters (counted under `other`)
    loss_scale           what backward multiplies the loss by (1 except for fp16)
    checkpoint_state()   the live tensors a checkpoint saves and a resume loads into, in place
    restore(state)       after a load: take back what is not a tensor of the optimizer (the loss scale)
    after_load()         after a load into the device's tensors: bring any other copy up to date
    host_tensors()       what the optimizer keeps in host memory, by category (ZeRO-Offload; else empty)

Implemented by `AdamWUpdater` (fp32, replicated or tensor-parallel parameters), `ShardedAdamWUpdater`
(ZeRO: each rank updates its slices), `OffloadedAdamWUpdater` (ZeRO-Offload: optim/offload.py) and
`MixedPrecisionUpdater` (optim/mixed_precision.py).

The norm: each tensor's norm in one multi-tensor kernel (`torch._foreach_norm`, as clip_grad_norm_), their
squares summed locally, then over tp for tensor-parallel shards (replicated parameters count once), over dp
for ZeRO slices, and over pp when the model is cut into stages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.optim.adamw import AdamHyper, AdamW, apply_update, clip_coefficient
from workbench.parallel.param_facts import ParamTable
from workbench.parallel.tp_communications import TPContext, all_reduce_tp

__all__ = [
    "AdamHyper",
    "AdamWUpdater",
    "ShardedAdamWUpdater",
    "Updater",
    "adamw",
    "clip_coefficient",
    "global_grad_norm",
    "scale_grads",
    "sharded_grad_norm",
    "squares",
]


class Updater(Protocol):
    @property
    def loss_scale(self) -> float:
        """What backward multiplies the loss by (1 except for fp16)."""

    def step(self, lr: float, max_norm: float | None) -> torch.Tensor | float | None: ...

    def state_tensors(self) -> list[torch.Tensor]: ...

    def counter_tensors(self) -> list[torch.Tensor]: ...

    def metrics(self) -> dict[str, Any]:
        """Extra facts of the last step for the trace and metrics.jsonl (the fp16 loss scale ...)."""

    def checkpoint_state(self) -> dict[str, torch.Tensor]: ...

    def restore(self, state: dict[str, torch.Tensor]) -> None: ...

    def after_load(self) -> None: ...

    def host_tensors(self) -> dict[str, list[torch.Tensor]]: ...


def adamw(
    params: Sequence[torch.Tensor],
    lr: float,
    hyper: AdamHyper,
    *,
    facts: ParamTable | None = None,
    like: Sequence[torch.Tensor] | None = None,
    foreach: bool | None = None,
) -> AdamW:
    """torch's AdamW: fused on CUDA, multi-tensor on the CPU (the same on every layout): optim/adamw.py.
    Weight decay on the elements each tensor's facts say (`decay_ranges`: optim/weight_decay.py) — or, for
    copies (fp32 masters, host slices), the facts of the tensors they copy (`like`). No `facts`: an
    optimizer built on its own, every tensor plain (decayed whole, as torch's AdamW)."""
    described = params if like is None else like
    facts = ParamTable.plain(described) if facts is None else facts
    return AdamW(
        params,
        lr=lr,
        betas=hyper.betas,
        eps=hyper.eps,
        weight_decay=hyper.weight_decay,
        foreach=foreach,
        decay=[facts[t].decayed(t.numel()) for t in described],
    )


def adam_state(optimizer: AdamW) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(moments, step counters) of an Adam-family optimizer."""
    moments: list[torch.Tensor] = []
    counters: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value):
                (counters if key == "step" else moments).append(value)
    return moments, counters


def adam_checkpoint_state(
    optimizer: AdamW, params: Sequence[torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Adam's state of each parameter, keyed by its position. Where the optimizer has not stepped yet it
    is created as AdamW's first step would (step 0, zero moments), so a load has tensors to fill."""
    out = {}
    for i, p in enumerate(params):
        out.update({f"{i}.{k}": v for k, v in optimizer.state_of(p).items()})
    return out


def set_lr(optimizer: AdamW, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def squares(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Σ‖g‖² of `grads` in fp32: each tensor's norm in one multi-tensor kernel (clip_grad_norm_'s
    `_foreach_norm`), then the squares summed — a handful of kernels whatever the number of tensors."""
    if not grads:
        return torch.zeros((), device=device)
    norms = torch._foreach_norm([g if g.dtype == torch.float32 else g.float() for g in grads])
    return torch.stack(norms).square().sum()


def _sum_over_pp(sq: torch.Tensor, pp_comm: Communicator | None) -> torch.Tensor:
    if pp_comm is None:
        return sq
    sq = sq.reshape(1).clone()
    pp_comm.all_reduce(
        sq, "pp", label="grad norm", meta={"layer": "grad norm", "direction": "optimizer"}
    )
    return sq[0]


def global_grad_norm(
    params: Sequence[nn.Parameter],
    *,
    facts: ParamTable,
    tp: TPContext | None = None,
    pp_comm: Communicator | None = None,
    ep_comm: Communicator | None = None,
    grads: Sequence[torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """‖g‖ of the whole model when each rank holds whole or tensor-parallel parameters: shards' squares
    summed over tp, replicated ones counted once, every stage's share summed over pp, DualPipe's second
    copies not counted (which is which: the parameters' `facts`). `grads`: one per parameter (a 16-bit
    model's fp32 ones), else each `p.grad`."""
    device = params[0].device
    pairs = [
        (p, g)
        for p, g in zip(params, [p.grad for p in params] if grads is None else grads, strict=True)
        if g is not None
    ]
    pairs = [(p, g) for p, g in pairs if not facts[p].pipeline_copy]  # DualPipe: counted once
    experts = [g for p, g in pairs if facts[p].expert_sharded]
    pairs = [(p, g) for p, g in pairs if not facts[p].expert_sharded]
    sharded = [g for p, g in pairs if facts[p].tp_sharded]
    replicated = [g for p, g in pairs if not facts[p].tp_sharded]
    if tp is not None and tp.size > 1:
        sq = all_reduce_tp(squares(sharded, device).reshape(1), tp, "grad norm", "optimizer")[0]
        sq = sq + squares(replicated, device)
    else:
        sq = squares(sharded + replicated, device)
    # expert parallelism: each ep rank's experts are its own, their squares summed
    if ep_comm is not None:
        ex = squares(experts, device).reshape(1).clone()
        ep_comm.all_reduce(ex, "ep", label="expert grad norm")
        sq = sq + ex[0]
    return _sum_over_pp(sq, pp_comm).sqrt()


def sharded_grad_norm(
    shards: Sequence[nn.Parameter],
    comm: Communicator,
    *,
    facts: ParamTable,
    pp_comm: Communicator | None = None,
    group: str = "dp",
) -> torch.Tensor:
    """‖g‖ when each dp rank holds disjoint slices of the gradient (ZeRO): the slices' squares summed
    over the group they were cut over (their facts' `zero_group`, else `group`; padding is zero and adds
    nothing) — dp, or under expert parallelism the experts' over edp and then over ep (each ep rank's
    experts are its own) —, then over pp."""
    by_group: dict[str, list[nn.Parameter]] = {}
    for s in shards:
        by_group.setdefault(facts[s].zero_group or group, []).append(s)
    total = torch.zeros((), device=shards[0].device)
    for g, mine in by_group.items():  # the same order on every rank: the grad sync's
        sq = squares([s.grad for s in mine if s.grad is not None], total.device).reshape(1).clone()
        comm.all_reduce(sq, g, label="zero grad norm")
        if g == "edp":
            comm.all_reduce(sq, "ep", label="zero expert grad norm")
        total = total + sq[0]
    return _sum_over_pp(total, pp_comm).sqrt()


def scale_grads(params: Sequence[nn.Parameter], coef: torch.Tensor | None) -> None:
    """Multiply every gradient by the clipping coefficient, in place (one multi-tensor kernel)."""
    grads = [p.grad for p in params if p.grad is not None]
    if coef is not None and grads:
        torch._foreach_mul_(grads, coef.to(grads[0].device))


class AdamWUpdater:
    """fp32 AdamW on the parameters this rank holds (whole, or tensor-parallel shards). Owns the optimizer
    and its state; is handed the parameters, their facts (what decays, what is a shard; None: all plain),
    the tensor-parallel context and the communicators of the norm's sums over pp and ep (None: not cut
    that way)."""

    loss_scale = 1.0

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        *,
        lr: float,
        hyper: AdamHyper,
        facts: ParamTable | None = None,
        tp: TPContext | None = None,
        pp_comm: Communicator | None = None,
        ep_comm: Communicator | None = None,
    ) -> None:
        self.params, self.tp, self.pp_comm, self.ep_comm = list(params), tp, pp_comm, ep_comm
        self.facts = ParamTable.plain(self.params) if facts is None else facts
        self.optimizer = adamw(self.params, lr, hyper, facts=self.facts)

    def step(self, lr: float, max_norm: float | None) -> torch.Tensor | float | None:
        """The global norm (a device tensor, not read here), clipping and AdamW: parallel/adamw.apply_update."""
        set_lr(self.optimizer, lr)
        norm = self.grad_norm()
        if apply_update(self.optimizer, [p.grad for p in self.params], norm, max_norm) is not False:
            self.after_update()  # (fused: the kernel skipped a non-finite step; gathering unchanged slices is harmless)
        return norm

    def grad_norm(self) -> torch.Tensor:
        return global_grad_norm(
            self.params, facts=self.facts, tp=self.tp, pp_comm=self.pp_comm, ep_comm=self.ep_comm
        )

    def after_update(self) -> None:
        return None

    def anomaly(self, norm: torch.Tensor) -> bool:
        """A non-finite global gradient norm: skip the update (the same on every rank). Reads the norm on the
        host: the updaters that need it there (ZeRO-Offload, 1-bit Adam)."""
        return not bool(torch.isfinite(norm))

    def state_tensors(self) -> list[torch.Tensor]:
        return adam_state(self.optimizer)[0]

    def counter_tensors(self) -> list[torch.Tensor]:
        return adam_state(self.optimizer)[1]

    def metrics(self) -> dict[str, Any]:
        return {}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        return adam_checkpoint_state(self.optimizer, self.params)

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        return None

    def after_load(self) -> None:
        return None

    def host_tensors(self) -> dict[str, list[torch.Tensor]]:
        return {}


class ShardedAdamWUpdater(AdamWUpdater):
    """ZeRO's optimizer: AdamW on this rank's slices only (its moments are 8Ψ/N bytes), then
    `after_step` (ZeRO-1/2: all-gather the updated slices into the full parameters; ZeRO-3: nothing,
    the next forward gathers)."""

    def __init__(
        self,
        shards: Sequence[nn.Parameter],
        comm: Communicator,
        *,
        lr: float,
        hyper: AdamHyper,
        facts: ParamTable | None = None,
        pp_comm: Communicator | None = None,
        after_step: Callable[[], None] | None = None,
        group: str = "dp",
    ) -> None:
        """`facts`: the slices' (the grad sync's `shard_facts`); `group`: the group the slices span."""
        super().__init__(shards, lr=lr, hyper=hyper, facts=facts, pp_comm=pp_comm)
        self.comm, self.after_step, self.group = comm, after_step, group

    def grad_norm(self) -> torch.Tensor:
        return sharded_grad_norm(
            self.params, self.comm, facts=self.facts, pp_comm=self.pp_comm, group=self.group
        )

    def after_update(self) -> None:
        if self.after_step is not None:
            self.after_step()
