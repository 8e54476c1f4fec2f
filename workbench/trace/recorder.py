"""Per-rank timeline recorder that writes Chrome Trace Event JSON (opens in Perfetto).

Every rank owns one `TraceRecorder`. Times are microseconds from an epoch that all ranks agree on at
start-up: right after a barrier each rank takes its own monotonic clock as zero (`set_epoch`, on the
rank's StepClock: trace/step_clock.py), so the barrier exit is t = 0 everywhere; the wall-clock difference
to rank 0 at that moment is recorded as `clock_offset_us`. The file layout is the contract in
docs/run-format.md.

Measured and fast steps (measure/schedule.py): `measured` says which the current step is — the StepClock's
mode, which the training step sets from its own argument (`start_step`). On a CUDA rank the recorder is
built with a `device_clock` (comm/device_timing.DeviceClock): in a measured step `sync_compute()` waits for
the compute stream at the end of each compute span, so spans are what the GPU did; in a fast step nothing
waits — each span records a CUDA event at its start and end, and its event is written once the step's one
host synchronisation has passed (`DeviceClock.end_step`). On the CPU spans are host-timed either way.

Lanes (`tid`) are fixed: spans on one lane nest because they come from nested `with span(...)`
blocks in one thread; work that overlaps on a lane (gradient buckets in flight) is written as async
`b`/`e` events instead, which Perfetto draws as separate tracks.

This module imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from workbench.trace.disk import writing
from workbench.trace.step_clock import StepClock

#: 2: host launch spans moved from `comm` to their own lane `launch` (category `launch`, no bytes), so that
#: each operation has exactly one record with bytes; `host_memory` counter (ZeRO-Offload)
#: 3: measured and fast steps (`measured` on each ProfilerStep, `measured_steps` in the workbench block); the
#: batch's making on its own lane `data` (category `data`)
SCHEMA_VERSION = 3

#: lane name -> tid, in display order
LANES: dict[str, int] = {
    "compute": 0,
    "comm": 1,
    "wait": 2,
    "schedule": 3,
    "ring": 4,
    "launch": 5,
    "offload": 6,
    "data": 7,
}

#: memory categories of the `memory` counter (torch.profiler's, extended): the one list every reader uses
MEMORY_CATEGORIES = (
    "parameter",
    "gradient",
    "optimizer_state",
    "activation",
    "loss",
    "wgrad_stash",
    "comm_buffer",
    "temporary",
    "other",
)

CATEGORIES = (
    "step",
    "forward",
    "backward",
    "recompute",
    "optimizer",
    "collective",
    "p2p",
    "ring_step",
    "cp_ring",
    "wait",
    "schedule",
    "checkpoint",
    "emulated",
    "launch",
    "offload",
    "data",
)


def flow_id(*parts: object) -> int:
    """A flow id derived from the parts (step, group, seq, source, destination ...), equal on both
    ranks of a transfer and unique across the merged file; below 2**53 so JavaScript keeps it exact."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 11


class DeviceSpans(Protocol):
    """What the recorder asks of a device clock (comm/device_timing.DeviceClock on CUDA): an event now, a fast
    span's times once the step has synchronised, a wait for the compute stream."""

    def mark(self) -> Any: ...

    def defer_span(self, start: Any, emit: Callable[[float, float], None]) -> None: ...

    def sync_compute(self) -> None: ...


#: NVTX's (push, pop): every span is also a range Nsight Systems shows
Nvtx = tuple[Callable[[str], object], Callable[[], object]]


class TraceRecorder:
    """One rank's timeline and the facts of its `workbench` block. Owns its events; handed, by keyword when
    it is built (`setup`, engine/context.py), the rank's StepClock (time, and whether the step is measured),
    and on CUDA the device clock that times fast steps' spans and NVTX's push and pop. `info` holds extra
    facts (parameter shapes, the attempt ...) that the run adds as it learns them; `clock_offset_us` and
    `events` are given when a trace is rebuilt from its stream (`recover_partial`)."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        backend: str,
        coords: dict[str, int],
        run_name: str,
        enabled: bool = True,
        clock: StepClock | None = None,
        device_clock: DeviceSpans | None = None,
        nvtx: Nvtx | None = None,
        info: dict[str, Any] | None = None,
        clock_offset_us: float = 0.0,
        events: list[dict[str, Any]] | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.coords = coords
        self.run_name = run_name
        self.enabled = enabled
        self.clock = clock or StepClock()
        #: CUDA: times a fast step's spans by events and synchronises a measured one's
        self.device_clock = device_clock
        self.nvtx = nvtx
        self.info: dict[str, Any] = dict(info or {})  # extra facts for the `workbench` block
        self.clock_offset_us = clock_offset_us
        self.events: list[dict[str, Any]] = list(events or [])
        self._async_ids = 0
        self._lock = threading.Lock()
        self._partial_path: str | None = None
        self._flushed = 0

    # ---- clock -------------------------------------------------------------------------------
    def set_epoch(self) -> None:
        """Call right after a barrier on every rank: now becomes t = 0; where that is on the wall clock goes
        into the trace (`epoch_unix_us`: a restarted run's attempts are placed by it)."""
        self.clock.set_epoch()
        self.info["epoch_unix_us"] = time.time_ns() / 1000.0

    def set_clock_offset(self, offset_us: float) -> None:
        """The wall-clock difference to rank 0 at the epoch (gathered after it)."""
        self.clock_offset_us = offset_us

    def now_us(self) -> float:
        return self.clock.now_us()

    @property
    def measured(self) -> bool:
        """Whether the current step is measured (the StepClock's mode)."""
        return self.clock.measured

    def start_step(self, *, measured: bool) -> None:
        """The training step, as it starts (engine/train_step.py): measured or fast."""
        self.clock.start_step(measured=measured)

    # ---- events ------------------------------------------------------------------------------
    def _emit(self, event: dict[str, Any]) -> None:
        if self.enabled:
            event["pid"] = self.rank
            self.events.append(event)  # list.append is atomic: callbacks from comm threads are safe

    @contextmanager
    def span(
        self, name: str, cat: str, lane: str = "compute", **args: Any
    ) -> Iterator[dict[str, Any]]:
        """A complete ("X") event around the block. The yielded dict is the span's args: the block
        may add to it (bytes measured inside, for instance). In a fast step on CUDA its times are the
        device's, from two events, written at the step's end."""
        clock = self.device_clock if not self.measured and self.enabled else None
        start = self.now_us() if clock is None else clock.mark()
        if self.nvtx is not None:
            self.nvtx[0](name)
        try:
            yield args
        finally:
            if self.nvtx is not None:
                self.nvtx[1]()
            if clock is None:
                self.complete(name, cat, lane, start, self.now_us() - start, args=args)
            else:
                clock.defer_span(
                    start, lambda ts, end: self.complete(name, cat, lane, ts, end - ts, args=args)
                )

    @contextmanager
    def host_span(
        self, name: str, cat: str, lane: str = "compute", **args: Any
    ) -> Iterator[dict[str, Any]]:
        """A span timed on the host's clock in every step (a whole step: it ends after the step's host
        synchronisation, so the host's time is the device's)."""
        start = self.now_us()
        try:
            yield args
        finally:
            self.complete(name, cat, lane, start, self.now_us() - start, args=args)

    def sync_compute(self) -> None:
        """A measured step on CUDA: wait for the compute stream, so that the span ending now covers the kernels
        it launched but not the communication streams (whose overlap the trace is there to show). Nothing in
        a fast step, nor on the CPU."""
        if self.measured and self.device_clock is not None:
            self.device_clock.sync_compute()

    def complete(
        self, name: str, cat: str, lane: str, ts: float, dur: float, *, args: dict[str, Any]
    ) -> None:
        self._emit(
            {
                "ph": "X",
                "name": name,
                "cat": cat,
                "ts": round(ts, 3),
                "dur": round(max(dur, 0.0), 3),
                "tid": LANES[lane],
                "args": args,
            }
        )

    def new_async_id(self) -> int:
        with self._lock:
            self._async_ids += 1
            return self._async_ids

    def async_span(
        self,
        name: str,
        cat: str,
        lane: str,
        ts: float,
        end: float,
        *,
        args: dict[str, Any],
        local_id: int,
    ) -> None:
        """An async begin/end pair (work in flight that may overlap other work on the lane)."""
        base = {
            "name": name,
            "cat": cat,
            "tid": LANES[lane],
            "id2": {"local": f"{self.rank}:{local_id}"},
        }
        self._emit({**base, "ph": "b", "ts": round(ts, 3), "args": args})
        self._emit({**base, "ph": "e", "ts": round(max(end, ts), 3)})

    def flow(self, phase: str, fid: int, lane: str, ts: float, cat: str) -> None:
        """phase 's' inside the sending span, 'f' inside the receiving span (bound to its end)."""
        event = {
            "ph": phase,
            "id": fid,
            "name": cat,
            "cat": cat,
            "tid": LANES[lane],
            "ts": round(ts, 3),
        }
        if phase == "f":
            event["bp"] = "e"
        self._emit(event)

    def counter(self, name: str, values: Mapping[str, float], ts: float | None = None) -> None:
        self._emit(
            {
                "ph": "C",
                "name": name,
                "ts": round(self.now_us() if ts is None else ts, 3),
                "tid": 0,
                "args": dict(values),
            }
        )

    # ---- output ------------------------------------------------------------------------------
    def metadata_events(self) -> list[dict[str, Any]]:
        c = self.coords
        meta = [
            {
                "ph": "M",
                "name": "process_name",
                "pid": self.rank,
                "tid": 0,
                "args": {"name": f"rank {self.rank} (dp {c['dp']}, tp {c['tp']}, pp {c['pp']})"},
            },
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": self.rank,
                "tid": 0,
                "args": {"sort_index": self.rank},
            },
        ]
        for lane, tid in LANES.items():
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": self.rank,
                    "tid": tid,
                    "args": {"name": lane},
                }
            )
            meta.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": self.rank,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        return meta

    def to_dict(self) -> dict[str, Any]:
        return {
            "schemaVersion": SCHEMA_VERSION,
            "distributedInfo": {
                "backend": self.backend,
                "rank": self.rank,
                "world_size": self.world_size,
            },
            "displayTimeUnit": "ms",
            "workbench": {
                "run": self.run_name,
                "rank": self.rank,
                **self.coords,
                "clock_offset_us": self.clock_offset_us,
                **self.info,
            },
            "traceEvents": self.metadata_events() + list(self.events),
        }

    # ---- crash safety: an append-only sidecar that survives SIGKILL --------------------------
    def open_partial(self, path: str) -> None:
        """Start `path` (JSON lines): a header, then `flush()` appends the events recorded since."""
        self._partial_path, self._flushed = path, 0
        header = {k: v for k, v in self.to_dict().items() if k != "traceEvents"}
        with open(path, "w") as f:
            f.write(json.dumps(header) + "\n")

    def flush(self) -> None:
        if self._partial_path is None or not self.enabled:
            return
        end = len(self.events)
        with (
            writing(self._partial_path, f"rank {self.rank}'s trace events since its last step"),
            open(self._partial_path, "a") as f,
        ):
            for e in self.events[self._flushed : end]:
                f.write(json.dumps(e) + "\n")
        self._flushed = end

    def write(self, path: str) -> None:
        """Write atomically (a reader never sees half a file, even if the rank is killed mid-write)."""
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with (
                writing(
                    path, f"rank {self.rank}'s trace (its events stay in the stream beside it)"
                ),
                open(tmp, "w") as f,
            ):
                json.dump(self.to_dict(), f)
        except OSError:
            if os.path.exists(tmp):
                os.remove(tmp)  # half a file would fill what little is left
            raise
        os.replace(tmp, path)
        if self._partial_path is not None and os.path.exists(self._partial_path):
            os.remove(self._partial_path)
            self._partial_path = None


def recover_partial(path: str) -> dict[str, Any]:
    """Rebuild a trace from a rank's sidecar (for ranks that were killed before writing their trace).
    Async and counter events written so far are kept; a span still open when the rank died is lost."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    header = json.loads(lines[0])
    events = []
    for line in lines[1:]:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # the rank died mid-line
            break
    info, coords = header["distributedInfo"], header["workbench"]
    rec = TraceRecorder(
        rank=info["rank"],
        world_size=info["world_size"],
        backend=info["backend"],
        coords={k: coords[k] for k in ("dp", "tp", "pp")},
        run_name=coords["run"],
        clock_offset_us=coords.get("clock_offset_us", 0.0),
        info={
            k: v
            for k, v in coords.items()
            if k not in ("run", "rank", "dp", "tp", "pp", "clock_offset_us")
        },
        events=events,
    )
    out = rec.to_dict()
    out["workbench"]["recovered"] = True
    return out
