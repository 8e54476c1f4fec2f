"""A rank's torch.profiler (Kineto) trace read back onto our clock — what measure/torch_profile.py recorded
beside our own trace (`--profile-steps A:B`) — for `viz.timeline(run, torch_ops=True)`. No torch."""

from __future__ import annotations

import json
import os
from typing import Any

#: the range recorded at a known time of our clock: its timestamp in the Kineto file gives the offset
MARKER = "workbench:align"


def load_ops(run_dir: str, info: dict[str, Any]) -> list[dict[str, Any]]:
    """The CPU ops (and, on CUDA, kernels) of one rank's Kineto trace, on our clock: dicts with name, cat,
    start_us, dur_us — [] when the rank recorded none."""
    meta = info.get("torch_profile")
    if not meta or meta.get("offset_us") is None:
        return []
    path = os.path.join(run_dir, meta["file"])
    if not os.path.exists(path):
        return []
    with open(path) as f:
        events = json.load(f).get("traceEvents", [])
    shift = float(meta["offset_us"])
    return [
        {
            "name": e["name"],
            "cat": e.get("cat", ""),
            "start_us": float(e["ts"]) + shift,
            "dur_us": float(e.get("dur", 0.0)),
        }
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cpu_op", "kernel", "gpu_memcpy")
        and e.get("name") != MARKER
    ]
