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
`main_grad` (parallel/main_grad.py), accumulated and all-reduced in fp32, *is* its master's gradient —
unscaled in place, no copy. With 16-bit reduction the update makes fp32 copies of every gradient
(4 bytes per parameter) that live until the step ends: counted under `temporary` while they do.

`MixedPrecisionUpdater` is the `Updater` (parallel/updater.py) of a 16-bit model: `step` returns None
for a skipped step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.measure.memory import MemoryTracker
from workbench.parallel.main_grad import grad_of
from workbench.parallel.tp_communications import TPContext
from workbench.parallel.updater import (
    adam_checkpoint_state,
    adam_state,
    adamw,
    clip_coefficient,
    global_grad_norm,
    scale_grads,
    set_lr,
)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class MixedPrecisionUpdater:
    def __init__(self, params: Sequence[nn.Parameter], comm: Communicator, precision: str, lr: float,
                 weight_decay: float, init_scale: float = 2.0**16, growth_interval: int = 1000,
                 tp: TPContext | None = None, pp_comm: Communicator | None = None,
                 memory: MemoryTracker | None = None) -> None:
        self.params, self.comm, self.precision, self.memory = list(params), comm, precision, memory
        self.tp, self.pp_comm = tp, pp_comm
        self.masters = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        for p, m in zip(self.params, self.masters, strict=True):  # the gradient norm needs to know the shards
            m.tp_sharded = getattr(p, "tp_sharded", False)
        self.optimizer = adamw(self.masters, lr, weight_decay)
        self.scale = init_scale if precision == "fp16" else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.skipped = False
        self.anomaly: str | None = None  # why a step was skipped, other than an fp16 overflow

    @property
    def loss_scale(self) -> float:
        return self.scale

    def step(self, lr: float, max_norm: float | None) -> float | None:
        """Skip on overflow (halving the fp16 scale); else unscale into the fp32 masters, clip, update,
        copy back into the 16-bit parameters."""
        set_lr(self.optimizer, lr)
        if self.found_overflow():
            self.update_scale(True)
            return None
        copies = self.master_grads()
        norm = global_grad_norm(self.masters, self.tp, self.pp_comm)
        if not bool(torch.isfinite(norm)):  # a gradient anomaly (bf16, or fp16 past the overflow check)
            for m in self.masters:
                m.grad = None
            self.count_temporary(-copies)
            self.skipped, self.anomaly = True, "non-finite gradient norm"
            return None
        scale_grads(self.masters, clip_coefficient(norm, max_norm))
        self.optimizer.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters, strict=True):
                p.copy_(m)
        for m in self.masters:
            m.grad = None  # the fp32 gradients live only during the update
        self.count_temporary(-copies)
        self.update_scale(False)
        return float(norm)

    def master_grads(self) -> int:
        """Give every master its unscaled fp32 gradient: the main_grad itself where there is one, else
        an fp32 copy of the 16-bit gradient. Returns the bytes of copies made."""
        copies = 0
        for p, m in zip(self.params, self.masters, strict=True):
            g = grad_of(p)
            if g is None:
                m.grad = None
            elif g.dtype == torch.float32:
                m.grad = g.div_(self.scale)
            else:
                m.grad = g.float().div_(self.scale)
                copies += m.grad.numel() * 4
        self.count_temporary(copies)
        return copies

    def count_temporary(self, nbytes: int) -> None:
        if self.memory is not None and nbytes:
            self.memory.add("temporary", nbytes)
            self.memory.snapshot()

    def state_tensors(self) -> list[torch.Tensor]:
        """Adam's moments and the fp32 master weights: optimizer state in the ZeRO paper's accounting."""
        return adam_state(self.optimizer)[0] + list(self.masters)

    def counter_tensors(self) -> list[torch.Tensor]:
        return adam_state(self.optimizer)[1]

    def metrics(self) -> dict[str, Any]:
        return {"loss_scale": self.scale, "skipped": self.skipped, "anomaly": self.anomaly}

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Adam's state, the fp32 masters, and the loss scaler (scale, good steps in a row)."""
        return {**adam_checkpoint_state(self.optimizer, self.masters),
                **{f"master.{i}": m.data for i, m in enumerate(self.masters)},
                "loss_scaler": torch.tensor([self.scale, float(self.good_steps)], dtype=torch.float64)}

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
        # one flag per gradient, combined on the device: the host waits once (for the agreed answer), not
        # once per parameter as `if not torch.isfinite(g).all()` would make it
        flags = [torch.isfinite(g).all().logical_not() for p in self.params if (g := grad_of(p)) is not None]
        bad = torch.stack(flags).any().float().reshape(1) if flags else torch.zeros(1, device=self.params[0].device)
        self.comm.all_reduce(bad, "world", label="overflow check", reduce_op="max")
        return bool(bad.item() > 0)

    def update_scale(self, overflow: bool) -> None:
        self.skipped, self.anomaly = overflow, None
        if self.precision != "fp16":
            return
        if overflow:
            self.scale /= 2
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps % self.growth_interval == 0:
                self.scale *= 2
