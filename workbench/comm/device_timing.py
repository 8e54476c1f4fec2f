"""Communication timed on the GPU, not at launch.

On NCCL a collective returns — and its future completes — once its kernel is *queued* on NCCL's
stream; timing it on the host would measure the launch and let compute spans absorb the transfer. So
on CUDA the traced layer (comm/traced.py) records, per operation:

    launch      a CUDA event on the caller's stream: the collective cannot start before the work queued
                ahead of it, and NCCL's stream waits for exactly that
    duration    the kernel's own time, from NCCL's start/end events (`Work._get_duration()`, which needs
                TORCH_NCCL_ENABLE_TIMING=1: the worker sets it on CUDA runs before the process group
                exists); without it, the time until an event recorded after `wait()` on the caller's
                stream (an upper bound)

and resolves them when the step ends, after one device synchronisation: a span starts at its launch
event, or when the previous operation of the same group ends (one NCCL stream per group runs them in
order), and lasts its duration. Overlap, `comm_s` and bus bandwidth are then device time.

Host and device clocks: a reference event recorded right after a synchronisation at the step's start is
taken to be at that host instant; every event's host time is the reference's plus its elapsed time.
`DeviceClock(now_us, backend=...)` takes the event type as a parameter so that the arithmetic is
tested on a CPU with a fake clock.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


def enable_nccl_timing() -> None:
    """Ask NCCL to time its kernels (read when the process group is created)."""
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")


@dataclass
class Timed:
    """One operation waiting for its device times: `emit(start_us, end_us)` writes its record."""

    group: str
    launch: Any  # an event on the caller's stream at the launch
    work: Any  # the backend's Work, kept until the step ends for its duration
    after_wait: Any  # an event on the caller's stream after wait(): the fallback end
    emit: Callable[[float, float], None]


class DeviceClock:
    def __init__(self, now_us: Callable[[], float], synchronize: Callable[[], None] | None = None,
                 event: Callable[[], Any] | None = None) -> None:
        self.now_us = now_us
        self.synchronize = synchronize or torch.cuda.synchronize
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.pending: list[Timed] = []
        self.ref: Any = None
        self.ref_us = 0.0

    def start_step(self) -> None:
        """Synchronise, then take the reference: host and device agree at this instant."""
        self.synchronize()
        self.ref = self.mark()
        self.ref_us = self.now_us()

    def mark(self) -> Any:
        e = self.event()
        e.record()
        return e

    def host_us(self, event: Any) -> float:
        return self.ref_us + self.ref.elapsed_time(event) * 1000.0

    def end_step(self) -> int:
        """Synchronise, give every pending operation its device span, in launch order. Returns how many."""
        if self.ref is None:
            self.pending.clear()
            return 0
        self.synchronize()
        free: dict[str, float] = {}  # when each group's stream is next free
        for t in self.pending:
            start = max(self.host_us(t.launch), free.get(t.group, 0.0))
            dur = device_duration_us(t.work)
            end = start + dur if dur is not None else self.host_us(t.after_wait)
            free[t.group] = max(end, start)
            t.emit(start, max(end, start))
        done, self.pending = len(self.pending), []
        return done


def device_duration_us(work: Any) -> float | None:
    """The kernel's time from NCCL's own events (milliseconds there), or None where it was not timed."""
    try:
        return float(work._get_duration()) * 1000.0
    except (RuntimeError, AttributeError, ValueError):
        return None
