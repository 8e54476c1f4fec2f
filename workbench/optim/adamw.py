"""AdamW over the tensors a rank updates: torch's own kernels, without torch.optim.Optimizer.

Decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", 2019) on Adam
(Kingma & Ba, 2015). The arithmetic is `torch.optim.adamw.adamw`, the functional form that
`torch.optim.AdamW` itself calls, so every layout (whole parameters, tensor-parallel shards, ZeRO slices,
fp32 masters) runs the same operations in the same order:

    CUDA    torch's fused kernel (`fused=True`, as nanoGPT and torchtitan run it): one pass over p, g, m, v
            (28 bytes a parameter), the step counters on the device, and the loss scale's division, the
            clipping coefficient and the skip of a non-finite step folded in (`grad_scale`, `found_inf`),
            so the update never waits for the host
    CPU     torch's multi-tensor kernel (`foreach=True`): the same values as torch.optim.AdamW(foreach=False)
            bit for bit (tests/test_adamw.py); clipping and the skip are done by the caller, where reading
            the norm costs nothing

`apply_update` is that caller: unscale, clip, skip, update — on either path.

Why not `torch.optim.AdamW` itself: its base class's constructor imports torch._dynamo (the compiler),
about 1 s of CPU in every rank's start-up (measured: 1.0 s of a 2.6 s rank start-up here) — 4 s of an
8-rank launch on a 2-core laptop. The state is laid out as torch's: `state[p] = {"step", "exp_avg",
"exp_avg_sq"}` and `param_groups` with lr, betas, eps, weight_decay: the decayed tensors, then the rest.
Nothing is sharded here; the updaters (optim/updater.py) decide which tensors a rank owns.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.adamw import adamw as adamw_kernel


@dataclass(frozen=True, kw_only=True)
class AdamHyper:
    """AdamW's settings besides the learning rate, as torch.optim.AdamW names them. GPT-2/3 and Llama train
    with betas (0.9, 0.95) and weight decay 0.1; torch's defaults are (0.9, 0.999) and, for AdamW, 0.01."""

    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


class AdamW:
    """AdamW on a fixed list of tensors (the parameters, shards or masters this rank updates)."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        foreach: bool | None = None,
        fused: bool | None = None,
        decay: Sequence[list[tuple[int, int]]] | None = None,
    ) -> None:
        """`fused`: torch's fused kernel (default: where the tensors are on CUDA); otherwise `foreach`:
        torch's multi-tensor kernel (default) or one tensor at a time (False). `decay`: for each tensor, the
        [start, end) ranges of its elements that weight decay shrinks (optim/weight_decay.py); None: all.

        The groups, as torch.optim.AdamW's param_groups: tensors decayed whole (the kernel decays them), and
        the rest with weight_decay 0 — among them ZeRO slices holding matrices and gains at once, whose
        matrix elements are multiplied by (1 − lr·wd) just before the kernel, the very operation torch's
        AdamW starts its step with (so a slice decays bit for bit as the whole parameter would)."""
        self.params = list(params)
        self.fused = fused if fused is not None else any(p.is_cuda for p in self.params)
        self.foreach = foreach if foreach is not None else not self.fused
        self.weight_decay = weight_decay
        decay = (
            [[(0, p.numel())] for p in self.params] if decay is None else [list(r) for r in decay]
        )
        whole = [
            p
            for p, r in zip(self.params, decay, strict=True)
            if r == [(0, p.numel())] and p.numel()
        ]
        rest = [
            p
            for p, r in zip(self.params, decay, strict=True)
            if not (r == [(0, p.numel())] and p.numel())
        ]
        #: the decaying element runs of each tensor that decays in part (views: no copy)
        self.partial = {
            id(p): [p.view(-1)[a:b] for a, b in r]
            for p, r in zip(self.params, decay, strict=True)
            if r and r != [(0, p.numel())]
        }
        settings = {"lr": lr, "betas": betas, "eps": eps}
        self.param_groups: list[dict[str, Any]] = [
            {"params": members, **settings, "weight_decay": wd}
            for members, wd in ((whole, weight_decay), (rest, 0.0))
            if members
        ]
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def state_of(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """p's state, created as torch's AdamW creates it at the first step: step 0 (on the device for the
        fused kernel, as torch keeps it), zero moments."""
        state = self.state[p]
        if not state:
            zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
            step = torch.zeros((), dtype=torch.float32, device=p.device if self.fused else "cpu")
            state.update(step=step, exp_avg=zeros, exp_avg_sq=zeros.clone())
        return state

    @torch.no_grad()
    def step(
        self,
        grads: Sequence[torch.Tensor | None] | None = None,
        grad_scale: torch.Tensor | None = None,
        found_inf: torch.Tensor | None = None,
    ) -> None:
        """One update of every tensor that has a gradient (`grads`, one per parameter, or each `p.grad`);
        its state is created at its first step. Fused only: the kernel divides each gradient by
        `grad_scale` and leaves everything — the step counters too — as it was where `found_inf` is 1."""
        if (grad_scale is not None or found_inf is not None) and not self.fused:
            raise ValueError("grad_scale and found_inf need the fused kernel (fused=True)")
        given = [p.grad for p in self.params] if grads is None else list(grads)
        grad_of = {id(p): g for p, g in zip(self.params, given, strict=True)}
        for group in self.param_groups:
            with_grads = [(p, g) for p in group["params"] if (g := grad_of[id(p)]) is not None]
            if not with_grads:
                continue
            params, present = [p for p, _ in with_grads], [g for _, g in with_grads]
            runs = [v for p in params for v in self.partial.get(id(p), ())]
            if runs and self.weight_decay:
                self._decay_runs(runs, group["lr"], found_inf)
            states = [self.state_of(p) for p in params]
            beta1, beta2 = group["betas"]
            adamw_kernel(
                params,
                present,
                exp_avgs=[s["exp_avg"] for s in states],
                exp_avg_sqs=[s["exp_avg_sq"] for s in states],
                max_exp_avg_sqs=[],
                state_steps=[s["step"] for s in states],
                foreach=self.foreach if not self.fused else None,
                fused=self.fused or None,
                grad_scale=grad_scale,
                found_inf=found_inf,
                has_complex=any(torch.is_complex(p) for p in params),
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
            )

    def _decay_runs(
        self, runs: list[torch.Tensor], lr: float, found_inf: torch.Tensor | None
    ) -> None:
        """p ← p·(1 − lr·wd) on the decaying runs of partly decaying tensors; a step the fused kernel will skip
        (`found_inf` 1) multiplies by 1."""
        factor = 1 - lr * self.weight_decay
        if found_inf is None:
            torch._foreach_mul_(runs, factor)
        else:
            torch._foreach_mul_(runs, 1 - (1 - found_inf) * (lr * self.weight_decay))


def clip_coefficient(norm: torch.Tensor, max_norm: float | None) -> torch.Tensor | None:
    """torch.nn.utils.clip_grad_norm_'s scale: max_norm / (norm + 1e-6), at most 1 (None: no clipping)."""
    return None if max_norm is None else torch.clamp(max_norm / (norm + 1e-6), max=1.0)


def apply_update(
    optimizer: AdamW,
    grads: Sequence[torch.Tensor | None],
    norm: torch.Tensor,
    max_norm: float | None,
    loss_scale: float = 1.0,
) -> bool | None:
    """Gradients → new parameters: ÷ loss_scale, × the clipping coefficient of `norm` (the unscaled global
    norm), AdamW — unless `norm` is not finite, when nothing changes (the same on every rank: every rank
    holds the same global norm).

    Fused (CUDA): all of it inside the kernel, the skip included; returns None (the host has not looked).
    Otherwise: the host reads the norm (free on a CPU), skips or divides (only where the scale is not 1),
    multiplies in place as clip_grad_norm_ does, and steps; returns whether the step was taken."""
    coef = clip_coefficient(norm, max_norm)
    if optimizer.fused:
        found_inf = torch.isfinite(norm).logical_not().to(torch.float32)
        # the kernel divides each gradient by it
        scale = None if coef is None else loss_scale / coef
        if scale is None and loss_scale != 1.0:
            scale = torch.full((), loss_scale, dtype=torch.float32, device=norm.device)
        optimizer.step(grads, grad_scale=scale, found_inf=found_inf)
        return None
    if not bool(torch.isfinite(norm)):
        return False
    present = [g for g in grads if g is not None]
    if loss_scale != 1.0:
        torch._foreach_div_(present, loss_scale)
    if coef is not None:
        torch._foreach_mul_(present, coef)
    optimizer.step(grads)
    return True
