"""Communication timed on the GPU, and waits that block as they do on gloo.

On NCCL a collective returns — and `Work.wait()` returns — once its kernel is *queued*: the host runs
on while the GPU communicates. Timed on the host, a transfer would look instant, the time a rank waits
for its peers would land inside the next forward or backward, and a pipeline's bubble would be counted
as compute. So on CUDA the traced layer (comm/traced.py, comm/handle.py):

    at launch   records a CUDA event on the caller's stream and enters the operation in `pending`, in
                launch order (the device runs a stream's work in that order)
    at wait     makes the caller's stream wait for the operation (`Work.wait()`), records an event after
                it and **blocks the host until that event has passed** — polling, with the operation's
                deadline (its launch + the process-group timeout), so that a hung peer ends in a
                `CommError` on this rank, with its error file, instead of a silent wait. The blocked time
                is a `wait` span, as on gloo. NCCL's own kernel time (`Work._get_duration()`, which needs
                TORCH_NCCL_ENABLE_TIMING=1, set before the process group exists) is read then, and the
                Work is let go — it holds the operation's tensors (about 600 MB per step of gpt2-small
                bf16's TP clones, pipeline buffers and reduce-scatter outputs if kept to the step's end).
    at step end one synchronisation, then every operation's device span: it starts at its launch event,
                or when the previous operation on its stream ends, and lasts NCCL's duration (or until
                the event after its wait, an upper bound, where timing is off). Streams: one per group
                for collectives, one per group and set of peers for point-to-point (NCCL runs p2p on
                per-peer communicators).

The cost of blocking: one host–device round trip per waited operation, and the launch gap after it
(the GPU idles while the host queues the next kernels) — the same synchronisation that every compute
span of a measured step already makes (`TraceRecorder.sync_compute`), so a trace's times are what the GPU did.

Fast steps (measure/schedule.py) block nowhere: at a wait the caller's stream is ordered after the operation
(`Work.wait()`) and an event recorded, nothing more; the operation's span runs from its launch event to that
event (an upper bound: NCCL's own duration needs the Work kept to the step's end, and it holds the
operation's tensors). Compute spans are a start and an end event each (`mark`, `defer_span`: the trace
recorder's fast spans). A hung peer is then ended by NCCL's watchdog, with the process group's timeout.

Host and device clocks: a reference event recorded right after a synchronisation is taken to be at that
host instant (the stream is idle, so the event passes at once); every event's host time is the reference's
plus its elapsed time. A measured step synchronises at its start to take it; a fast step uses the one taken
after the previous step's synchronisation (the training step's single read of its loss, `end_step`).
`DeviceClock(now_us, synchronize=..., event=...)` takes the event type as a parameter so that the
arithmetic, the ordering and the deadline are tested on a CPU with a fake clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch


def enable_nccl_timing() -> None:
    """Ask NCCL to time its kernels (read when the process group is created)."""
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")


@dataclass(kw_only=True)
class Timed:
    """One launched operation (or batch) waiting for its device times: `emits` write its records."""

    stream: (
        Hashable  # where it queues on the device: ("collective", group) or ("p2p", group, peers)
    )
    launch: Any  # an event on the caller's stream at the launch
    emits: list[Callable[[float, float], None]] = field(default_factory=list)
    end: Any = None  # an event on the caller's stream after wait(): the fallback end
    duration_us: float | None = None  # NCCL's kernel time, read at the wait
    waited: bool = False


class DeviceTimeout(TimeoutError):
    """The device did not finish an operation before its deadline (a peer is stuck or gone)."""


class DeviceClock:
    def __init__(
        self,
        now_us: Callable[[], float],
        *,
        synchronize: Callable[[], None] | None = None,
        event: Callable[[], Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        measured: Callable[[], bool] = lambda: True,
        sync_compute: Callable[[], None] | None = None,
    ) -> None:
        """`measured`: whether the current step is measured (the trace recorder's flag); `sync_compute`:
        wait for the compute stream only (a measured step's compute spans)."""
        self.now_us = now_us
        self.synchronize = synchronize or torch.cuda.synchronize
        self.sync_compute = sync_compute or (lambda: torch.cuda.current_stream().synchronize())
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.sleep = sleep
        self.measured = measured
        self.pending: list[Timed] = []
        self.spans: list[
            tuple[Any, Any, Callable[[float, float], None]]
        ] = []  # a fast step's compute spans
        self.ref: Any = None
        self.ref_us = 0.0

    def start_step(self) -> None:
        """A measured step (or the first): synchronise, then take the reference — host and device agree at
        this instant. A fast step keeps the reference the last step's end took."""
        if self.measured() or self.ref is None:
            self.synchronize()
            self.reference()

    def reference(self) -> None:
        """Right after a synchronisation: an event that passes now, at this host instant."""
        self.ref = self.mark()
        self.ref_us = self.now_us()

    def defer_span(self, start: Any, emit: Callable[[float, float], None]) -> None:
        """A fast step's span ends now: its end event; `emit(start_us, end_us)` once the step has synchronised."""
        self.spans.append((start, self.mark(), emit))

    def mark(self) -> Any:
        e = self.event()
        e.record()
        return e

    def launched(self, stream: Hashable, emits: list[Callable[[float, float], None]]) -> Timed:
        """At a launch: the event, and the operation's place in launch order."""
        timed = Timed(stream=stream, launch=self.mark(), emits=emits)
        self.pending.append(timed)
        return timed

    def waited(self, timed: Timed, works: list[Any], deadline_us: float) -> None:
        """At a wait (after Work.wait()): in a measured step block the host until the operation is done on the
        device, or raise DeviceTimeout at `deadline_us` (host clock), then read NCCL's duration; in a fast
        step only mark the event after it."""
        timed.end = self.mark()
        if not self.measured():
            timed.waited = True
            return
        self.block_until(timed.end, deadline_us)
        durations = [d for d in (device_duration_us(w) for w in works) if d is not None]
        timed.duration_us = max(durations) if durations else None
        timed.waited = True

    def block_until(self, event: Any, deadline_us: float) -> None:
        """Poll `event` until the device has passed it (sleeping 50 µs, then 1 ms, between looks)."""
        first = self.now_us()
        while not event.query():
            now = self.now_us()
            if now > deadline_us:
                raise DeviceTimeout(
                    f"timed out: the device had not finished the operation {(now - first) / 1e6:.1f} s "
                    f"after this rank began waiting (the process-group timeout has passed)"
                )
            self.sleep(5e-5 if now - first < 10_000 else 1e-3)

    def host_us(self, event: Any) -> float:
        return self.ref_us + self.ref.elapsed_time(event) * 1000.0

    def end_step(self, synchronized: bool = False) -> int:
        """Synchronise (unless the caller just did: a fast step's one read), give every waited operation its
        device span in launch order and every fast span its times; take the next step's reference. Returns
        how many operations were written; one not yet waited for stays for the next step."""
        if self.ref is None:
            self.pending.clear()
            self.spans.clear()
            return 0
        if not synchronized:
            self.synchronize()
        for start, end, emit in self.spans:
            emit(self.host_us(start), self.host_us(end))
        self.spans.clear()
        free: dict[Hashable, float] = {}  # when each stream is next free
        kept, done = [], 0
        for t in self.pending:
            if not t.waited:
                kept.append(t)
                continue
            start = max(self.host_us(t.launch), free.get(t.stream, float("-inf")))
            end = (
                start + t.duration_us
                if t.duration_us is not None
                else max(self.host_us(t.end), start)
            )
            free[t.stream] = end
            for emit in t.emits:
                emit(start, end)
            done += 1
        self.pending = kept
        self.reference()
        return done


def device_duration_us(work: Any) -> float | None:
    """The kernel's time from NCCL's own events (milliseconds there), or None where it was not timed."""
    try:
        return float(work._get_duration()) * 1000.0
    except (RuntimeError, AttributeError, ValueError, TypeError):
        return None
