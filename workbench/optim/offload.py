"""ZeRO-Offload (Ren et al. 2021, "ZeRO-Offload: Democratizing Billion-Scale Model Training", arXiv
2101.06840; DeepSpeed's `offload_optimizer`): the optimizer of ZeRO-1/2/3 moved to host memory and the CPU.

What is where, per rank (ZeRO's partition of N ranks; this engine's ZeRO runs in fp32):

    device   the parameters ZeRO keeps there (whole for ZeRO-1/2, this rank's slice for ZeRO-3) and the
             gradients (whole for ZeRO-1, this rank's slice for ZeRO-2/3) — no optimizer state at all
    host     this rank's slice of the master weights, of the gradient, and of Adam's two moments:
             16Ψ/N bytes in pinned memory on CUDA (plain memory on a CPU run, where the host copies are
             separate tensors all the same, so the same code path runs and is tested)

One step:
    backward      as ZeRO without offload; each slice's gradient, once final (the GradSync's
                  `on_reduced`: `HostGradients.copy`), is copied device → host on a side stream
                  (`offload` span: d2h)
    norm, clip    the gradient norm on the device (the usual sharded all-reduce), one number to the host
    update        torch's AdamW, multi-tensor (foreach), on the host copies: the same arithmetic as the
                  update on the device, bit for bit on a CPU (tests/test_offload.py)
    back          each updated slice host → device (`offload` span: h2d), then ZeRO-1/2 all-gather the
                  parameters as usual

Device memory for model states falls from 16Ψ/N + ... to: ZeRO-1 8Ψ (fp32 parameters and gradients),
ZeRO-2 (4 + 4/N)Ψ, ZeRO-3 8Ψ/N; in mixed precision (the paper's setting, and the estimator's) ZeRO-2's
(2 + 2/N)Ψ. The price: 2 × 4Ψ/N bytes over PCIe per step and the update at the CPU's speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.optim.adamw import AdamHyper
from workbench.optim.updater import (
    ShardedAdamWUpdater,
    adam_checkpoint_state,
    adam_state,
    adamw,
    clip_coefficient,
    scale_grads,
    set_lr,
)
from workbench.parallel.flat import grad_of
from workbench.parallel.param_facts import ParamTable
from workbench.trace.recorder import TraceRecorder


class HostGradients:
    """This rank's gradient slices in host memory and their device → host copies (on CUDA on a side stream,
    not waited for until the update). Built by the strategy before the ZeRO grad sync, which is given `copy`
    as its `on_reduced` (each slice copied the moment it is final), and handed to the
    `OffloadedAdamWUpdater`, which steps on the copies. `comm`: the communicator whose step the `offload`
    spans carry."""

    def __init__(
        self, *, device: torch.device, recorder: TraceRecorder, comm: Communicator
    ) -> None:
        self.device, self.recorder, self.comm = device, recorder, comm
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self.grads: dict[int, torch.Tensor] = {}  # slice → its host gradient
        self.copied: dict[int, Any] = {}  # slice → its copy this step (an event on CUDA)

    def host_like(self, t: torch.Tensor) -> torch.Tensor:
        """An fp32 host tensor shaped like `t` (pinned on CUDA), uninitialised."""
        return torch.empty(t.shape, dtype=torch.float32, device="cpu", pin_memory=self.cuda)

    def buffer(self, i: int, like: torch.Tensor) -> torch.Tensor:
        """Slice i's host gradient (zeroed when first asked for)."""
        if i not in self.grads:
            self.grads[i] = self.host_like(like).zero_()
        return self.grads[i]

    def copy(self, i: int, grad: torch.Tensor) -> None:
        """Copy slice i's final gradient to the host (on CUDA: on the side stream, not waited for here)."""
        host = self.buffer(i, grad)
        with self.recorder.span(
            f"offload grad {i} d2h",
            "offload",
            "offload",
            slice=i,
            bytes=grad.numel() * grad.element_size(),
            direction="d2h",
            step=self.comm.step,
        ):
            if self.side is None:
                host.copy_(grad)
                self.copied[i] = True
                return
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                host.copy_(grad, non_blocking=True)
                grad.record_stream(self.side)
                event = torch.cuda.Event()
                event.record(self.side)
                self.copied[i] = event

    def gather(self, device_grads: Sequence[torch.Tensor | None]) -> None:
        """Before the update: every slice on the host — those the grad sync did not report (a pipeline
        stage's, say) copied now —, the side stream's copies waited for."""
        for i, grad in enumerate(device_grads):
            if i not in self.copied and grad is not None:
                self.copy(i, grad)
        if self.side is not None:
            with self.recorder.span("offload wait d2h", "offload", "offload", step=self.comm.step):
                for event in self.copied.values():
                    event.synchronize()
        self.forget()

    def forget(self) -> None:
        """A new step: no slice copied yet."""
        self.copied = {}


class OffloadedAdamWUpdater(ShardedAdamWUpdater):
    """ZeRO's optimizer on the host: the sharded updater's norm and gathering, with AdamW on host copies
    of this rank's slices. Owns the host master slices and the host optimizer; is handed the slices and
    their facts, the host gradients (`HostGradients`, which the grad sync fills) and the recorder of its
    `offload` spans."""

    def __init__(
        self,
        shards: Sequence[nn.Parameter],
        comm: Communicator,
        *,
        lr: float,
        hyper: AdamHyper,
        host_grads: HostGradients,
        recorder: TraceRecorder,
        facts: ParamTable | None = None,
        pp_comm: Communicator | None = None,
        after_step: Callable[[], None] | None = None,
        group: str = "dp",
    ) -> None:
        super().__init__(
            shards,
            comm,
            lr=lr,
            hyper=hyper,
            facts=facts,
            pp_comm=pp_comm,
            after_step=after_step,
            group=group,
        )
        self.host_grads, self.recorder = host_grads, recorder
        self.device = host_grads.device
        self.side = host_grads.side
        self.host_params = [
            nn.Parameter(host_grads.host_like(s).copy_(s.detach())) for s in self.params
        ]
        for i, (s, hp) in enumerate(zip(self.params, self.host_params, strict=True)):
            hp.grad = host_grads.buffer(i, s)
        # in place of the base's device optimizer (which never stepped, so never held a moment); each
        # slice's matrix elements decay
        self.optimizer = adamw(
            self.host_params, lr, hyper, facts=self.facts, like=self.params, foreach=True
        )

    # ---- the step -----------------------------------------------------------------------------------------
    def step(self, lr: float, max_norm: float | None) -> torch.Tensor | float | None:
        set_lr(self.optimizer, lr)
        norm = self.grad_norm()
        if self.anomaly(norm):  # skipped: the training step reads the norm and says why
            self.host_grads.forget()
            return norm
        value = float(norm)
        self.host_grads.gather([s.grad for s in self.params])
        # on the host's copies
        scale_grads(self.host_params, clip_coefficient(norm.to("cpu"), max_norm))
        self.optimizer.step()
        self._parameters_to_device()
        self.after_update()
        return value

    def _parameters_to_device(self) -> None:
        """Each updated slice host → device. On CUDA on the side stream, after the work already queued on the
        compute stream (which may still read the parameters it overwrites), and the compute stream then waits
        for the copies."""
        rec = self.recorder
        if self.side is not None:
            self.side.wait_stream(torch.cuda.current_stream(self.device))
        for i, (shard, hp) in enumerate(zip(self.params, self.host_params, strict=True)):
            with rec.span(
                f"offload param {i} h2d",
                "offload",
                "offload",
                slice=i,
                direction="h2d",
                bytes=hp.numel() * hp.element_size(),
                step=self.comm.step,
            ):
                if self.side is None:
                    shard.data.copy_(hp.detach())
                    continue
                with torch.cuda.stream(self.side):
                    shard.data.copy_(hp.detach(), non_blocking=True)
        if self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)

    # ---- what it holds ----------------------------------------------------------------------------------
    def state_tensors(self) -> list[torch.Tensor]:
        return []  # nothing of the optimizer stays on the device

    def host_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The host's side of the memory categories: master slices, gradient slices, Adam's moments."""
        return {
            "parameter": list(self.host_params),
            "gradient": [grad_of(hp) for hp in self.host_params],
            "optimizer_state": adam_state(self.optimizer)[0],
        }

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """Adam's state of the host copies, keyed as a device-resident ZeRO optimizer keys it (by slice)."""
        return adam_checkpoint_state(self.optimizer, self.host_params)

    def after_load(self) -> None:
        """After a checkpoint was loaded into the device's slices: the host's master copies follow them."""
        with torch.no_grad():
            for shard, hp in zip(self.params, self.host_params, strict=True):
                hp.copy_(shard.detach())
