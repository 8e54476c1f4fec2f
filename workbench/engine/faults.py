"""Faults injected for tests and teaching (`RunConfig.fault` on `fault_rank` at `fault_step`), each what a
real failure does to a step:

    raise       the rank raises: it writes its error file, torchrun stops the others (launching/worker.py)
    hang        the rank sleeps past the process groups' timeout: the others end in CommError, naming it
    kill        SIGKILL, no handler runs (first attempt only): a lost machine; torchrun restarts the group
    overflow    the loss scale is inf on that rank: its gradients overflow, every rank skips the step
    nan-grad    the loss scale is NaN there: a non-finite gradient norm, every rank skips the step
    nan-params  the rank's parameters become NaN before that step, as a bad update leaves them: the run
                cannot recover, and stops (engine/anomaly.py)
    loss-spike  that rank's loss (and so its gradients) × 10: what loss_spike_factor catches
    straggle    from fault_step on the rank sleeps fault_delay_s each step: the others wait at the next
                collective (`workbench doctor` names it)

Injection wraps the step rather than living in it: where a fault is asked, the training loop
(engine/train.py) decorates its Strategy (`with_fault`), whose forward and backward become a
`FaultyForwardBackward` around the real one. The plain step (engine/train_step.py) holds no fault code,
and a run without a fault has no injection at all. Inside the decorator a fault acts where a real failure
would: before the step's forward (raise, hang, kill, straggle, nan-params), or on the loss scale its
backward runs at and the loss it returns (overflow, nan-grad, loss-spike).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from workbench.config import RunConfig
from workbench.engine.forward_backward import ForwardBackward
from workbench.engine.parallelize import Strategy
from workbench.model.moe import MoEState
from workbench.model.moe import start_step as moe_start


@dataclass(frozen=True, kw_only=True)
class Fault:
    """The fault this rank (`rank`) suffers: its kind, the step it strikes at (from which on, for a
    straggler), a straggler's delay and the process groups' timeout (a hang outlasts it ten times)."""

    kind: str
    rank: int
    step: int
    delay_s: float
    timeout_s: float

    @classmethod
    def asked(cls, config: RunConfig, *, rank: int, attempt: int) -> Fault | None:
        """Rank `rank`'s fault in attempt `attempt`, or None: none asked, another rank's, or a kill in a
        restarted attempt (it fires in the first only, so the restarted group can finish)."""
        if config.fault is None or rank != config.fault_rank:
            return None
        if config.fault == "kill" and attempt > 0:
            return None
        return cls(
            kind=config.fault,
            rank=rank,
            step=config.fault_step,
            delay_s=config.fault_delay_s,
            timeout_s=config.timeout_s,
        )

    def strikes(self, step: int) -> bool:
        return step == self.step


def with_fault(strategy: Strategy, fault: Fault, *, microbatches: int) -> Strategy:
    """`strategy` with `fault` injected: the same parts, its forward and backward decorated."""
    faulty = FaultyForwardBackward(
        strategy.forward_backward,
        fault=fault,
        params=strategy.state_params,
        moe=strategy.moe,
        microbatches=microbatches,
    )
    return dataclasses.replace(strategy, forward_backward=faulty)


class FaultyForwardBackward:
    """A ForwardBackward (engine/forward_backward.py) with the rank's fault injected: the real one
    (`inner`) runs every step; at the fault's step it first does what the fault does. Handed the rank's
    parameters (nan-params fills them), and where the model has experts their shared state and the
    microbatch count: the aux loss's gradient takes the faulted loss scale too (model/moe.py)."""

    def __init__(
        self,
        inner: ForwardBackward,
        *,
        fault: Fault,
        params: list[torch.Tensor],
        moe: MoEState | None,
        microbatches: int,
    ) -> None:
        self.inner, self.fault = inner, fault
        self.params, self.moe, self.microbatches = params, moe, microbatches

    def run(
        self, x: torch.Tensor, y: torch.Tensor, step: int, loss_scale: float = 1.0
    ) -> torch.Tensor:
        inject_fault(self.fault, step)
        corrupt_parameters(self.fault, step, self.params)
        spike = spike_factor(self.fault, step)
        scale = faulted_scale(self.fault, step, loss_scale) * spike
        if self.moe is not None and scale != loss_scale:
            moe_start(self.moe, scale / self.microbatches)
        loss = self.inner.run(x, y, step, scale)
        return loss * spike if spike != 1.0 else loss

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        return self.inner.evaluate(x, y, step)


def spike_factor(fault: Fault, step: int) -> float:
    """10 at the step of an injected loss spike (the rank's loss and gradients ×10), else 1."""
    return 10.0 if fault.kind == "loss-spike" and fault.strikes(step) else 1.0


def faulted_scale(fault: Fault, step: int, scale: float) -> float:
    """The loss scale `scale`, or inf (NaN) at the step of an injected overflow (nan-grad)."""
    if fault.kind in ("overflow", "nan-grad") and fault.strikes(step):
        # this rank's gradients become inf/NaN: every rank must skip the step
        return float("inf") if fault.kind == "overflow" else float("nan")
    return scale


def inject_fault(fault: Fault, step: int) -> None:
    """The faults that strike before the step's forward: a straggler's sleep, raise, hang, kill."""
    if fault.kind == "straggle" and step >= fault.step:
        # a slow rank: every other one waits for it at the next collective
        time.sleep(fault.delay_s)
    if not fault.strikes(step):
        return
    if fault.kind == "raise":
        raise RuntimeError(f"injected fault on rank {fault.rank} at step {step}")
    if fault.kind == "hang":
        time.sleep(10 * fault.timeout_s)  # the other ranks must time out, not wait forever
    if fault.kind == "kill":  # no handler runs: what a lost machine does
        os.kill(os.getpid(), signal.SIGKILL)


def corrupt_parameters(fault: Fault, step: int, params: Iterable[torch.Tensor]) -> None:
    """'nan-params': every parameter of this rank NaN, before the step's forward."""
    if fault.kind == "nan-params" and fault.strikes(step):
        with torch.no_grad():
            for p in params:
                p.fill_(float("nan"))
