"""Which steps are *measured* and which run *fast* — torch.profiler's schedule (wait, then active), for
everything this project records.

    measured   memory by category (the saved-tensor hooks that count activations, a snapshot after each
               forward, backward and update, the model states re-counted), the allocator read beside it on
               CUDA, spans timed on a synchronised device, each collective waited for on the host with its
               deadline
    fast       no hook pushed, no allocator read, no snapshot; spans timed by CUDA events and read after the
               step's one host synchronisation (the loss and the gradient norm, read together); on the CPU
               the host's clock, which is the device's

The same arithmetic runs in both (the losses are bit-identical whatever the schedule: tests/test_measure.py).

`measure` (RunConfig):
    'auto'   every step on the CPU, where measuring costs a few per cent (docs/guide/running.md); on a GPU three
             steps from the first one the summary's times count (after warmup_steps_excluded), where it costs
             ~15 % of a step — the run's speed is then the fast steps'
    'all'    every step; 'none': none (memory is then not recorded)
    'A:B'    steps A..B−1

No torch here: the config validates it, the ranks resolve it.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config.rules import parse_measure

#: how many steps 'auto' measures on a GPU, after the excluded warm-up steps
AUTO_GPU_STEPS = 3


@dataclass(frozen=True, kw_only=True)
class MeasureSchedule:
    """Steps first..stop−1 measured, the rest fast (plus `extra`: a step another tool needs measured)."""

    first: int
    stop: int
    extra: frozenset[int] = frozenset()

    def measured(self, step: int) -> bool:
        return self.first <= step < self.stop or step in self.extra

    def describe(self) -> str:
        steps = sorted(set(range(self.first, self.stop)) | self.extra)
        if not steps:
            return "none"
        if steps == list(range(steps[0], steps[-1] + 1)):
            return f"{steps[0]}..{steps[-1]}" if len(steps) > 1 else str(steps[0])
        return ", ".join(map(str, steps))


def measure_schedule(
    spec: str,
    steps: int,
    device_type: str,
    warmup_excluded: int = 1,
    trace: bool = True,
    *,
    also: tuple[int, ...] = (),
) -> MeasureSchedule:
    """The schedule a rank runs: `spec` resolved for its device (see the module's docstring); `also`: steps
    that must be measured whatever the schedule (the CPU memory profile's step reads the snapshots' marks)."""
    explicit = parse_measure(spec, steps)
    if explicit is not None:
        first, stop = explicit
    elif not trace:  # nothing is recorded: every step runs fast
        first, stop = 0, 0
    elif device_type != "cuda":
        first, stop = 0, steps
    else:
        first = min(warmup_excluded, steps - 1)
        stop = min(first + AUTO_GPU_STEPS, steps)
    return MeasureSchedule(
        first=first, stop=stop, extra=frozenset(s for s in also if 0 <= s < steps)
    )
