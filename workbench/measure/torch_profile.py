"""torch.profiler beside our trace (`--profile-steps A:B`): a Kineto trace per rank of steps A..B−1 (CPU ops;
on CUDA also kernels, memcpys and NCCL), into RUN/profile/rank<r>.json.

The directory holds nothing else, so Holistic Trace Analysis reads it as it is
(`hta.trace_analysis.TraceAnalysis(trace_dir=RUN/profile)`): torch.profiler writes each file's
`distributedInfo` (rank, world size, backend) itself when the process group exists.

Aligned to our clock: right after the profiler starts, a `workbench:align` range is recorded at a known time
of our clock; its timestamp in the exported file gives the offset (Kineto's clock → ours), kept in the rank's
trace info (`torch_profile`: file, offset_us) for `viz.timeline(run, torch_ops=True)` to overlay the op lanes.
(torch is imported only where a profile is taken; trace/torch_ops.py reads the file back for the charts.)
"""

from __future__ import annotations

import json
import os
from typing import Any

from workbench.trace.torch_ops import MARKER


class TorchProfile:
    """`before(step)` / `after(step)` around each training step; profiles `steps`, (first, stop): the
    steps [first, stop)."""

    def __init__(
        self, run_dir: str, rank: int, recorder: Any, device: Any, steps: tuple[int, int]
    ) -> None:
        self.path = os.path.join(run_dir, "profile", f"rank{rank}.json")
        self.recorder, self.device = recorder, device
        self.first, self.stop = steps
        self.profiler: Any = None
        self.marker_us = 0.0

    def before(self, step: int) -> None:
        if step != self.first:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # a schedule (all steps active) makes the profiler mark each step as a ProfilerStep#N range — HTA's
        # iterations — numbered with our steps; it hands the trace over when the last one ends
        every = torch.profiler.schedule(
            skip_first=step, wait=0, warmup=0, active=self.stop - self.first, repeat=1
        )
        self.profiler = torch.profiler.profile(
            activities=activities, schedule=every, on_trace_ready=self._export
        )
        self.profiler.step_num = step
        self.profiler.current_action = every(step)  # (set at construction from step 0: skipped)
        self.profiler.start()
        self.marker_us = self.recorder.now_us()
        with torch.profiler.record_function(MARKER):
            pass

    def after(self, step: int) -> None:
        if self.profiler is None:
            return
        if self.device.type == "cuda" and step == self.stop - 1:
            import torch

            torch.cuda.synchronize(self.device)
        self.profiler.step()
        if step == self.stop - 1:
            self.profiler.stop()
            self.profiler = None

    def _export(self, profiler: Any) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        profiler.export_chrome_trace(self.path)
        self.recorder.info["torch_profile"] = {
            "file": os.path.relpath(self.path, os.path.dirname(os.path.dirname(self.path))),
            "offset_us": self._offset_us(),
            "steps": [self.first, self.stop],
        }

    def _offset_us(self) -> float | None:
        """Ours minus Kineto's time of the marker: add it to a Kineto `ts` to place it on our timeline."""
        with open(self.path) as f:
            trace = json.load(f)
        marks = [
            e
            for e in trace.get("traceEvents", [])
            if e.get("name") == MARKER and e.get("ph") == "X"
        ]
        return self.marker_us - float(marks[0]["ts"]) if marks else None
