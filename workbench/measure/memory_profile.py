"""`--profile-memory`: what the allocator really holds at each memory snapshot, beside the categories.

CPU: torch.profiler with `profile_memory=True` records every allocation and free made while it runs,
with the allocator's running total. It starts before the model is built — so its total is everything
the rank allocated — and stops after the chosen step. Each snapshot drops a marker (`wb_snapshot#i`)
into the profile; afterwards the last memory event before each marker gives the allocator's live bytes
at that snapshot, which goes into our trace as an `allocator` counter at the snapshot's time, for the
snapshots of the chosen step. The
profile itself is kept as `memory_profile_rank{r}.json` (a Chrome trace: Perfetto opens it).

CUDA: the `allocator` counter is read at every snapshot anyway (`torch.cuda.memory_allocated`); with
`--profile-memory` the caching allocator's history is recorded from the start and, after the chosen
step, dumped to `memory_snapshot_rank{r}.pickle`, which https://pytorch.org/memory_viz opens.
"""

from __future__ import annotations

import json
import os

import torch

MARKER = "wb_snapshot#"


class MemoryProfile:
    def __init__(self, device: torch.device, run_dir: str, rank: int) -> None:
        self.device, self.run_dir, self.rank = device, run_dir, rank
        self._profiler: torch.profiler.profile | None = None
        self.markers = 0
        self.active = False

    def start(self) -> MemoryProfile:
        if self.device.type == "cuda":
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        else:
            self._profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            self._profiler.__enter__()
        self.active = True
        return self

    def marker(self) -> int | None:
        """A mark in the profile at this instant; its index (None on CUDA, where nothing is matched)."""
        if not self.active or self._profiler is None:
            return None
        with torch.profiler.record_function(f"{MARKER}{self.markers}"):
            pass
        self.markers += 1
        return self.markers - 1

    def stop(self) -> dict[int, dict[str, int]]:
        """End the profile, keep its file, and return the allocator's live bytes at each marker
        (`allocated_at_markers`)."""
        if not self.active:
            return {}
        self.active = False
        if self._profiler is None:
            torch.cuda.memory._dump_snapshot(
                os.path.join(self.run_dir, f"memory_snapshot_rank{self.rank}.pickle")
            )
            torch.cuda.memory._record_memory_history(enabled=None)
            return {}
        self._profiler.__exit__(None, None, None)
        path = os.path.join(self.run_dir, f"memory_profile_rank{self.rank}.json")
        self._profiler.export_chrome_trace(path)
        with open(path) as f:
            return allocated_at_markers(json.load(f)["traceEvents"])


def allocated_at_markers(events: list[dict]) -> dict[int, dict[str, int]]:
    """For each `wb_snapshot#i` marker, the CPU allocator's live bytes just before it: `allocated` (its
    running total) and `backend_threads` (the live bytes that threads other than the one that marks the
    snapshots allocated — the communication backend's workers: gloo gathers an all-gather into a flat
    buffer of the output's size on its worker thread, which it frees when the operation ends). Each
    allocation is followed by its address until it is freed, on whichever thread.

    And the true peak between snapshots: `high_water` (the most the allocator held from this marker to the
    next — every allocation and free counts, not only the snapshots' instants), `high_water_backend` (the
    backend's bytes then) and `high_water_after_us` (how long after this marker it came)."""
    markers = [e for e in events if str(e.get("name", "")).startswith(MARKER)]
    main = markers[0]["tid"] if markers else None
    timeline = sorted(
        [
            (e["ts"], 0, e)
            for e in events
            if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0
        ]
        + [(e["ts"], 1, e) for e in markers],
        key=lambda x: (x[0], x[1]),
    )
    out: dict[int, dict[str, int]] = {}
    total, other, live = 0, 0, {}  # live: address → (bytes, allocated on another thread)
    current, since = None, 0.0  # the last marker passed, and when
    for ts, kind, e in timeline:
        if kind == 1:
            current, since = int(e["name"][len(MARKER) :]), ts
            out[current] = {
                "allocated": total,
                "backend_threads": other,
                "high_water": total,
                "high_water_backend": other,
                "high_water_after_us": 0,
            }
            continue
        a = e["args"]
        total, size, addr = int(a["Total Allocated"]), int(a["Bytes"]), a.get("Addr")
        if size > 0:
            live[addr] = (size, e["tid"] != main)
            other += size if e["tid"] != main else 0
        elif (known := live.pop(addr, None)) is not None and known[1]:
            other -= known[0]
        if current is not None and total > out[current]["high_water"]:
            out[current].update(
                high_water=total, high_water_backend=other, high_water_after_us=int(ts - since)
            )
    return out
