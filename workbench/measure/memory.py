"""Memory by category per rank, counted from the tensors the engine really holds.

Categories (torch.profiler's, extended): `parameter`, `gradient`, `optimizer_state`, `activation`,
`loss`, `wgrad_stash`, `comm_buffer`, `temporary`, `other`.

- parameter / gradient / optimizer_state: the bytes of the distinct storages behind the model's
  parameters, their gradients (the data-parallel buckets, when gradients are views into them) and the
  optimizer's state tensors. Adam's `step` counters (one 4-byte scalar per parameter tensor) are
  counted under `other`, so that `optimizer_state` is exactly the 2 × 4Ψ of the moments the formulas
  speak of.
- activation: bytes saved for backward, counted through `torch.autograd.graph.saved_tensors_hooks`:
  a storage is added when the forward first saves it (parameters saved by matmuls are not
  activations) and released when backward has unpacked every save of it — as backward consumes
  them, so the counter shows the saw-tooth of forward and backward, 1F1B's microbatches in flight and
  a recomputed block's rerun as they happen.
- loss: the loss's bytes at their peak, reported by the loss (model/cross_entropy.py) at that instant — the logits
  (unpacked, so no longer activations), their gradient and a block's fp32 temporaries.
- comm_buffer / temporary: reported by whoever allocates them (the ring's receive buffer ...).
- other: Adam's step counters, and what the data source keeps for the run (the synthetic chain's table).
- wgrad_stash: a zero-bubble schedule's Linear inputs and output gradients, kept from each I until its
  W (pipeline/weight_grad.py).

All of it runs in *measured* steps only (measure/schedule.py): the tracker reads the mode from
`recorder.measured` — the rank's StepClock (trace/step_clock.py), whose one writer is the training step's
`measured` argument. A fast step pushes no saved-tensor hook, takes no snapshot, re-counts nothing and
never reads the allocator. `add` still counts
(Python arithmetic, no tensor touched), so what a step holds balances whichever kind it is.

These are the device's (on a CPU run, the rank's) bytes. With ZeRO-Offload the optimizer lives in host
memory: a second counter, `host_memory`, holds its parameter (fp32 master slices), gradient and
optimizer_state bytes there.

`snapshot()` emits a `memory` counter event with every category (and on CUDA an `allocator` counter
with torch.cuda.memory_allocated / memory_reserved and the allocator's peak since the step began) and
keeps the peak of each category. Activations
emit one themselves each time they have moved by 1/16 of their peak since the last.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import torch

from workbench.trace.recorder import MEMORY_CATEGORIES as CATEGORIES
from workbench.trace.recorder import TraceRecorder

if TYPE_CHECKING:
    from workbench.measure.memory_profile import MemoryProfile


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class MemoryCounter(Protocol):
    """What the pieces that allocate (the communicator's staging copies, ZeRO's gathered units and buckets in
    flight, the loss, recomputation, the zero-bubble stash) tell the rank's memory tracker. Each is handed
    one at construction: the rank's `MemoryTracker`, or `NO_MEMORY` where a piece is built on its own."""

    def add(self, category: str, delta: int) -> None: ...

    def snapshot(self) -> None: ...

    def not_activation(self, t: torch.Tensor) -> None: ...

    def forget_not_activation(self, t: torch.Tensor) -> None: ...

    def count_saved_activations(self) -> AbstractContextManager[None]: ...


class NoMemory:
    """A `MemoryCounter` that counts nothing: the tracker of a piece built without a rank (a test, a
    benchmark), so the pieces never ask whether they have one."""

    def add(self, category: str, delta: int) -> None:
        return None

    def snapshot(self) -> None:
        return None

    def not_activation(self, t: torch.Tensor) -> None:
        return None

    def forget_not_activation(self, t: torch.Tensor) -> None:
        return None

    def count_saved_activations(self) -> AbstractContextManager[None]:
        return nullcontext()


NO_MEMORY = NoMemory()


class MemoryTracker:
    """One rank's memory by category (the module's docstring): built by engine/context.setup with the rank's
    recorder (whose `measured` says whether the step is measured), its device and, with --profile-memory,
    the profile its snapshots mark (measure/memory_profile.py; started by the training loop before the
    model is built); handed to every piece that allocates."""

    def __init__(
        self,
        recorder: TraceRecorder,
        device: torch.device,
        *,
        profile: MemoryProfile | None = None,
    ) -> None:
        self.recorder = recorder
        self.device = device
        self.current: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.peak_allocator: dict[str, int] = {}
        self._not_activations: set[int] = set()  # storages of parameters and buffers
        self._lock = threading.Lock()
        self._saved: dict[
            int, list[int]
        ] = {}  # activation storage → [saves not yet unpacked, bytes]
        self._activation_at_snapshot = 0
        #: --profile-memory: the profile the snapshots mark (measure/memory_profile.py), and when each was
        self.profile = profile
        self._marker_ts: dict[int, float] = {}
        #: ZeRO-Offload: what the host holds for the optimizer, by category (None: nothing offloaded)
        self.host: dict[str, int] | None = None
        self.host_peak: dict[str, int] = {}

    def not_activation(self, t: torch.Tensor) -> None:
        """Storage that autograd may save but that is not an activation (re-gathered ZeRO-3 parameters)."""
        self._not_activations.add(t.untyped_storage().data_ptr())

    def forget_not_activation(self, t: torch.Tensor) -> None:
        """Before that storage is freed: its address may next hold a real activation."""
        self._not_activations.discard(t.untyped_storage().data_ptr())

    def register_model(self, model: torch.nn.Module) -> None:
        """Parameters and buffers (the causal mask ...) that autograd saves are not activations."""
        tensors = list(model.parameters()) + list(model.buffers())
        self._not_activations |= {t.untyped_storage().data_ptr() for t in tensors}

    # ---- updates -----------------------------------------------------------------------------
    def set(self, category: str, value: int) -> None:
        self.current[category] = int(value)
        self._update_peaks()

    def add(self, category: str, delta: int) -> None:
        # the communication backend's completion callbacks report from its own thread
        with self._lock:
            self.current[category] += int(delta)
            self._update_peaks()

    def _update_peaks(self) -> None:
        for k, v in self.current.items():
            self.peak[k] = max(self.peak[k], v)
        self.peak_total = max(self.peak_total, sum(self.current.values()))

    def count_model_states(
        self,
        params: Iterable[torch.Tensor],
        grads: Iterable[torch.Tensor | None],
        states: Iterable[torch.Tensor] = (),
        counters: Iterable[torch.Tensor] = (),
        *,
        data_bytes: int = 0,
    ) -> None:
        """Re-count the model-state categories from the live tensors: parameters, gradients, optimizer
        states (moments and fp32 masters, `Updater.state_tensors()`) and, under `other`, Adam's step
        counters (`Updater.counter_tensors()`) with `data_bytes`, what the data source keeps for the run
        (engine/batches.Batches.resident_bytes: the synthetic chain's table). Measured steps only."""
        if not self.recorder.measured:
            return
        self.current["parameter"] = storage_bytes(params)
        self.current["gradient"] = storage_bytes(grads)
        self.current["optimizer_state"] = storage_bytes(states)
        self.current["other"] = storage_bytes(counters) + data_bytes
        self._update_peaks()

    def count_host(self, tensors: dict[str, list[torch.Tensor]]) -> None:
        """ZeRO-Offload's host side: bytes of the master, gradient and moment slices kept in host memory."""
        if not self.recorder.measured and self.host is not None:
            return
        self.host = {k: storage_bytes(v) for k, v in tensors.items()}
        for k, v in self.host.items():
            self.host_peak[k] = max(self.host_peak.get(k, 0), v)

    # ---- activations -------------------------------------------------------------------------
    @contextmanager
    def count_saved_activations(self) -> Iterator[None]:
        """Inside the block, every tensor autograd saves for backward adds its storage to `activation`
        (once, however many nodes save it); backward's last unpack of it takes it off again. A fast step
        pushes no hook."""
        if not self.recorder.measured:
            yield
            return
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter):  # parameters saved by matmuls are not activations
            return t
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr == 0 or ptr in self._not_activations:
            return t
        if ptr in self._saved:
            self._saved[ptr][0] += 1
        else:
            self._saved[ptr] = [1, s.nbytes()]
            self.add("activation", s.nbytes())
            self._maybe_snapshot()
        return t

    def _unpack(self, t: torch.Tensor) -> torch.Tensor:
        entry = self._saved.get(t.untyped_storage().data_ptr())
        if entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                del self._saved[t.untyped_storage().data_ptr()]
                self.add("activation", -entry[1])
                self._maybe_snapshot()
        return t

    def _maybe_snapshot(self) -> None:
        if abs(self.current["activation"] - self._activation_at_snapshot) * 16 >= max(
            self.peak["activation"], 1
        ):
            self.snapshot()

    def release_activations(self) -> int:
        """After a step's backwards: forget what is left (saves never unpacked); returns those bytes."""
        left = self.current["activation"]
        self._saved.clear()
        self.set("activation", 0)
        return left

    # ---- records -----------------------------------------------------------------------------
    def snapshot(self) -> None:
        """The categories as a `memory` counter now (and on CUDA the allocator's figures): measured steps only."""
        if not self.recorder.measured:
            return
        self._activation_at_snapshot = self.current["activation"]
        ts = self.recorder.now_us()
        self.recorder.counter("memory", self.current, ts=ts)
        if self.host is not None:  # ZeRO-Offload: the host's side, at the same instant
            self.recorder.counter("host_memory", self.host, ts=ts)
        if self.profile is not None and (marker := self.profile.marker()) is not None:
            self._marker_ts[marker] = ts
        # the caching allocator's figures, and its peak since the step began
        if self.device.type == "cuda":
            alloc = {
                "allocated": torch.cuda.memory_allocated(self.device),
                "max_allocated": torch.cuda.max_memory_allocated(self.device),
                "reserved": torch.cuda.memory_reserved(self.device),
            }
            self._allocator_counter(alloc, ts)

    def start_step(self) -> None:
        """CUDA: the allocator's peak restarts with each step (once per step, not at every snapshot: the
        reset is a call into the allocator, and a user's own peak readings would be wiped each time). Measured
        steps only."""
        if self.device.type == "cuda" and self.recorder.measured:
            torch.cuda.reset_peak_memory_stats(self.device)

    def record_allocator(self, at_marker: dict[int, dict[str, int]], since_us: float = 0.0) -> None:
        """The allocator's live bytes at the marked snapshots from `since_us` on (CPU, --profile-memory:
        the chosen step), as counters at those snapshots' times (`allocated`, `backend_threads`); and its true
        peak, the highest it went between two snapshots, as an `allocator_peak` counter at that moment, with the
        snapshot whose categories held then (`after_snapshot_us`)."""
        # (bytes, backend's, when, after which snapshot)
        best: tuple[int, int, float, float] | None = None
        for marker, values in sorted(at_marker.items()):
            ts = self._marker_ts.get(marker, -1.0)
            if ts < since_us:
                continue
            self._allocator_counter({k: values[k] for k in ("allocated", "backend_threads")}, ts)
            if best is None or values["high_water"] > best[0]:
                best = (
                    values["high_water"],
                    values["high_water_backend"],
                    ts + values["high_water_after_us"],
                    ts,
                )
        if best is not None:
            self.recorder.counter(
                "allocator_peak",
                {"allocated": best[0], "backend_threads": best[1], "after_snapshot_us": best[3]},
                ts=best[2],
            )

    def _allocator_counter(self, values: dict[str, int], ts: float) -> None:
        for k, v in values.items():
            self.peak_allocator[k] = max(self.peak_allocator.get(k, 0), v)
        self.recorder.counter("allocator", values, ts=ts)

    def peaks(self) -> dict[str, Any]:
        out: dict[str, Any] = {"by_category": dict(self.peak), "total": self.peak_total}
        if self.peak_allocator:
            out["allocator"] = dict(self.peak_allocator)
        return out
