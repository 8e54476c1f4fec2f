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
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

import torch

from workbench.config import RunConfig
from workbench.engine.restart import attempt


def spike_factor(cfg: RunConfig, rank: int, step: int) -> float:
    """10 on the rank and step of an injected loss spike (its loss and gradients ×10), else 1."""
    return (
        10.0
        if cfg.fault == "loss-spike" and rank == cfg.fault_rank and step == cfg.fault_step
        else 1.0
    )


def loss_scale(cfg: RunConfig, rank: int, step: int, scale: float) -> float:
    """The updater's loss scale `scale`, or inf (NaN) on the rank and step of an injected overflow (nan-grad)."""
    if cfg.fault in ("overflow", "nan-grad") and rank == cfg.fault_rank and step == cfg.fault_step:
        # this rank's gradients become inf/NaN: every rank must skip the step
        return float("inf") if cfg.fault == "overflow" else float("nan")
    return scale


def inject_fault(cfg: RunConfig, rank: int, step: int) -> None:
    if cfg.fault == "straggle" and rank == cfg.fault_rank and step >= cfg.fault_step:
        time.sleep(
            cfg.fault_delay_s
        )  # a slow rank: every other one waits for it at the next collective
    if cfg.fault is None or rank != cfg.fault_rank or step != cfg.fault_step:
        return
    if cfg.fault == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if cfg.fault == "hang":
        time.sleep(10 * cfg.timeout_s)  # the other ranks must time out, not wait forever
    if cfg.fault == "kill" and attempt() == 0:  # no handler runs: what a lost machine does
        os.kill(os.getpid(), signal.SIGKILL)
    # "overflow" is injected into the loss scale of that step (see loss_scale)


def corrupt_parameters(
    cfg: RunConfig, rank: int, step: int, params: Iterable[torch.Tensor]
) -> None:
    """'nan-params': every parameter of this rank NaN, before the step's forward."""
    if cfg.fault == "nan-params" and rank == cfg.fault_rank and step == cfg.fault_step:
        with torch.no_grad():
            for p in params:
                p.fill_(float("nan"))
