"""Mixed-precision training (Micikevicius et al. 2018, "Mixed Precision Training"): 16-bit parameters,
activations and gradients; fp32 master weights and Adam moments; for fp16, dynamic loss scaling.

Memory per parameter, measured: 2 bytes of 16-bit parameter, 4 of fp32 main gradient (Megatron's 18Ψ;
2 with `grad_reduce_dtype` in 16 bits, the ZeRO paper's 16Ψ), 12 of optimizer state (4 fp32 master
weight + 4 momentum + 4 variance).

One step:
    backward of loss × scale (fp16; bf16 has fp32's range and needs no scaling)
    → every rank checks its gradients for inf/NaN, and all ranks agree (a max all-reduce over the world)
    → overflow: skip the step, halve the scale
    → otherwise: master gradients = the gradients in fp32 ÷ scale, clip, AdamW on the masters,
      copy the masters back into the 16-bit parameters; after `growth_interval` good steps in a row
      the scale doubles (PyTorch's GradScaler policy).

The fp32 gradients: with `grad_reduce_dtype='fp32'` (the default, Megatron's) each parameter's fp32
main gradient (parallel/main_grad.MainGrads, handed in), accumulated and all-reduced in fp32, *is* its
master's gradient — unscaled in place, no copy. With 16-bit reduction the update makes fp32 copies of every gradient
(4 bytes per parameter) that live until the step ends: counted under `temporary` while they do.

Flat buffers: the 16-bit parameters live end to end in one buffer and the fp32 masters in another
(parallel/flat.py), so the copy back is one kernel; the norm is one multi-tensor kernel and the update
torch's fused AdamW on CUDA, with the loss scale's division, the clipping and the skip of a non-finite step
inside it (parallel/adamw.apply_update) — no kernel per tensor, and for bf16 nothing the host waits for.
fp16's overflow check is one multi-tensor norm whatever the number of parameters, read on the host once a step
(the flag every rank agrees on).

`MixedPrecisionUpdater` is the `Updater` (optim/updater.py) of a 16-bit model: `step` returns None
for a step skipped on an fp16 overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.optim.adamw import AdamHyper, apply_update
from workbench.optim.updater import (
    adam_checkpoint_state,
    adam_state,
    adamw,
    global_grad_norm,
    set_lr,
)
from workbench.parallel.flat import flatten_params, views
from workbench.parallel.main_grad import MainGrads
from workbench.parallel.param_facts import ParamTable
from workbench.parallel.tp_communications import TPContext

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecisionUpdater:
    """Owns the flat 16-bit and fp32 buffers, the masters, the optimizer and the loss scaler; is handed the
    16-bit parameters, their facts (what decays, what is a tp shard; None: every one plain), where their
    fp32 main gradients are (`main_grads`: the data-parallel grad sync's), the communicator (the overflow
    check's agreement), the tensor-parallel context and pp communicator of the norm, and the memory
    tracker (the fp32 copies of 16-bit gradients are `temporary`)."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        comm: Communicator,
        *,
        precision: str,
        lr: float,
        hyper: AdamHyper,
        init_scale: float = 2.0**16,
        growth_interval: int = 1000,
        facts: ParamTable | None = None,
        main_grads: MainGrads | None = None,
        tp: TPContext | None = None,
        pp_comm: Communicator | None = None,
        memory: MemoryCounter = NO_MEMORY,
    ) -> None:
        self.params, self.comm, self.precision, self.memory = list(params), comm, precision, memory
        self.tp, self.pp_comm = tp, pp_comm
        self.facts = ParamTable.plain(self.params) if facts is None else facts
        self.main_grads = MainGrads() if main_grads is None else main_grads
        self.flat16 = flatten_params(self.params)  # each p.data a view of it
        self.flat32 = self.flat16.float()
        self.masters = [nn.Parameter(v) for v in views(self.flat32, self.params)]  # views: no copy
        # decay as the 16-bit parameters'
        self.optimizer = adamw(self.masters, lr, hyper, facts=self.facts, like=self.params)
        self.scale = init_scale if precision == "fp16" else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0

    @property
    def loss_scale(self) -> float:
        return self.scale

    @torch.no_grad()
    def step(self, lr: float, max_norm: float | None) -> torch.Tensor | None:
        """Skip on overflow (halving the fp16 scale); else the masters' fp32 gradients unscaled and clipped,
        AdamW on the masters, and the masters copied back into the 16-bit parameters (one kernel). Returns
        the norm, not read (a non-finite one skipped the update)."""
        set_lr(self.optimizer, lr)
        if self.found_overflow():
            self.update_scale(True)
            return None
        grads, copies = self.master_grads()
        fused = self.optimizer.fused
        present = [g for g in grads if g is not None]
        # the CPU divides first, then takes the norm of what it steps with
        if self.scale != 1.0 and not fused:
            torch._foreach_div_(present, self.scale)
        norm = global_grad_norm(
            self.params, facts=self.facts, tp=self.tp, pp_comm=self.pp_comm, grads=grads
        )
        # the fused kernel divides: the norm of the scaled gradients, unscaled
        if self.scale != 1.0 and fused:
            norm = norm / self.scale
        taken = apply_update(self.optimizer, grads, norm, max_norm, self.scale if fused else 1.0)
        if taken is not False:
            self.flat16.copy_(self.flat32)
        del grads, present
        self.count_temporary(-copies)
        if taken is not False:
            self.update_scale(False)
        return norm

    def master_grads(self) -> tuple[list[torch.Tensor | None], int]:
        """Each master's fp32 gradient, still scaled: the main_grad itself where there is one, else a copy of
        the 16-bit gradient into one flat fp32 buffer (counted under `temporary` while it lives). Returns them
        and the bytes of copies."""
        raw = [self.main_grads.grad_of(p) for p in self.params]
        if all(g is None or g.dtype == torch.float32 for g in raw):
            return raw, 0
        copies = torch.empty_like(self.flat32)
        out = [
            None if g is None else c for g, c in zip(raw, views(copies, self.params), strict=True)
        ]
        torch._foreach_copy_([c for c in out if c is not None], [g for g in raw if g is not None])
        self.count_temporary(copies.numel() * 4)
        return out, copies.numel() * 4

    def count_temporary(self, nbytes: int) -> None:
        if nbytes:
            self.memory.add("temporary", nbytes)
            self.memory.snapshot()

    def state_tensors(self) -> list[torch.Tensor]:
        """Adam's moments and the fp32 master weights: optimizer state in the ZeRO paper's accounting."""
        return adam_state(self.optimizer)[0] + list(self.masters)

    def counter_tensors(self) -> list[torch.Tensor]:
        return adam_state(self.optimizer)[1]

    def metrics(self) -> dict[str, Any]:
        return {"loss_scale": self.scale}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Adam's state, the fp32 masters, and the loss scaler (scale, good steps in a row)."""
        return {
            **adam_checkpoint_state(self.optimizer, self.masters),
            **{f"master.{i}": m.data for i, m in enumerate(self.masters)},
            "loss_scaler": torch.tensor([self.scale, float(self.good_steps)], dtype=torch.float64),
        }

    def restore(self, state: dict[str, torch.Tensor]) -> None:
        self.scale, good = state["loss_scaler"].tolist()
        self.good_steps = int(good)

    def after_load(self) -> None:
        return None

    def host_tensors(self) -> dict[str, list[torch.Tensor]]:
        return {}

    def found_overflow(self) -> bool:
        """Whether any rank's gradients hold inf or NaN (all ranks must agree to skip together). Only
        fp16 checks: bf16 has fp32's exponent range and is not scaled."""
        if self.precision != "fp16":
            return False
        # one multi-tensor norm over every gradient (in fp32: an fp16 norm of finite values can itself overflow),
        # inf or NaN exactly where some gradient holds one; the host waits once, for the answer all ranks agree on
        grads = [g for p in self.params if (g := self.main_grads.grad_of(p)) is not None]
        bad = torch.zeros(1, device=self.params[0].device)
        if grads:
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
            bad = torch.stack(norms).sum().isfinite().logical_not().float().reshape(1)
        if self.comm.size("world") > 1:
            self.comm.all_reduce(bad, "world", label="overflow check", reduce_op="max")
        return bool(bad.item() > 0)

    def update_scale(self, overflow: bool) -> None:
        if self.precision != "fp16":
            return
        if overflow:
            self.scale /= 2
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= 2
