"""A rank's host clock and the mode of the step it is in: what its trace recorder and, on CUDA, its device
clock (comm/device_timing.DeviceClock) both read. `setup` (engine/context.py) builds one per rank and hands
it to each of them by keyword.

    time   microseconds from the epoch every rank agrees on: right after a barrier each rank calls
           `set_epoch`, so the barrier's exit is t = 0 everywhere
    mode   whether the current step is *measured* or *fast* (measure/schedule.py). The training step says
           which, from its own argument (`start_step`, engine/train_step.py); the mode holds until the next
           step starts, so the evaluation after a step is timed as that step was

One owner, one writer: everyone else reads `measured`.

This module imports no torch.
"""

from __future__ import annotations

import time


class StepClock:
    def __init__(self) -> None:
        self._anchor_ns = time.perf_counter_ns()
        self._measured = True

    def set_epoch(self) -> None:
        """Call right after a barrier on every rank: now becomes t = 0."""
        self._anchor_ns = time.perf_counter_ns()

    def now_us(self) -> float:
        return (time.perf_counter_ns() - self._anchor_ns) / 1000.0

    @property
    def measured(self) -> bool:
        """Whether the current step is measured (True before the first step: start-up is measured)."""
        return self._measured

    def start_step(self, *, measured: bool) -> None:
        """The training step, as it starts: measured or fast, as its caller asked."""
        self._measured = measured
