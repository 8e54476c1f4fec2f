"""Memory by category per rank, counted from the tensors the engine really holds.

Categories (torch.profiler's, extended): `parameter`, `gradient`, `optimizer_state`, `activation`,
`comm_buffer`, `temporary`, `other`.

- parameter / gradient / optimizer_state: the bytes of the distinct storages behind the model's
  parameters, their gradients (the data-parallel buckets, when gradients are views into them) and the
  optimizer's state tensors. Adam's `step` counters (one 4-byte scalar per parameter tensor) are
  counted under `other`, so that `optimizer_state` is exactly the 2 × 4Ψ of the moments the formulas
  speak of.
- activation: bytes saved for backward, counted through `torch.autograd.graph.saved_tensors_hooks`
  while the forward runs (each storage once; parameters saved by matmuls are not activations).
  They are freed by backward.
- comm_buffer / temporary: reported by whoever allocates them (the ring's receive buffer ...).

`snapshot()` emits a `memory` counter event with every category (and on CUDA an `allocator` counter
with torch.cuda.memory_allocated / memory_reserved) and keeps the peak of each category.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from workbench.trace.recorder import MEMORY_CATEGORIES as CATEGORIES
from workbench.trace.recorder import TraceRecorder


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class MemoryTracker:
    def __init__(self, recorder: TraceRecorder, device: torch.device) -> None:
        self.recorder = recorder
        self.device = device
        self.current: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.peak_allocator: dict[str, int] = {}
        self._not_activations: set[int] = set()  # storages of parameters and buffers

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
        self.current[category] += int(delta)
        self._update_peaks()

    def _update_peaks(self) -> None:
        for k, v in self.current.items():
            self.peak[k] = max(self.peak[k], v)
        self.peak_total = max(self.peak_total, sum(self.current.values()))

    def count_model_states(self, params: Iterable[torch.Tensor], grads: Iterable[torch.Tensor | None],
                           states: Iterable[torch.Tensor] = (), counters: Iterable[torch.Tensor] = ()) -> None:
        """Re-count the model-state categories from the live tensors: parameters, gradients, optimizer
        states (moments and fp32 masters, `Updater.state_tensors()`) and, under `other`, Adam's step
        counters (`Updater.counter_tensors()`)."""
        self.current["parameter"] = storage_bytes(params)
        self.current["gradient"] = storage_bytes(grads)
        self.current["optimizer_state"] = storage_bytes(states)
        self.current["other"] = storage_bytes(counters)
        self._update_peaks()

    # ---- activations -------------------------------------------------------------------------
    @contextmanager
    def count_saved_activations(self, already: Iterable[torch.Tensor] = ()) -> Iterator[None]:
        """Inside the block, every tensor autograd saves for backward adds to `activation` (once per
        storage; `already` lists tensors whose storage is counted elsewhere)."""
        seen: set[int] = {t.untyped_storage().data_ptr() for t in already}

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if isinstance(t, torch.nn.Parameter):  # parameters saved by matmuls are not activations
                return t
            if ptr not in seen and ptr not in self._not_activations and ptr != 0:
                seen.add(ptr)
                self.add("activation", s.nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    # ---- records -----------------------------------------------------------------------------
    def snapshot(self) -> None:
        self.recorder.counter("memory", self.current)
        if self.device.type == "cuda":
            alloc = {"allocated": torch.cuda.memory_allocated(self.device),
                     "reserved": torch.cuda.memory_reserved(self.device)}
            for k, v in alloc.items():
                self.peak_allocator[k] = max(self.peak_allocator.get(k, 0), v)
            self.recorder.counter("allocator", alloc)

    def peaks(self) -> dict[str, Any]:
        out: dict[str, Any] = {"by_category": dict(self.peak), "total": self.peak_total}
        if self.peak_allocator:
            out["allocator"] = dict(self.peak_allocator)
        return out
