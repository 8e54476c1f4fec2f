"""ZeRO stage 3 (Rajbhandari et al. 2020; the design of FSDP, Zhao et al. 2023): parameters are
partitioned too. Each rank keeps 1/N of every parameter, its gradient and its Adam moments (16Ψ/N
bytes in fp32); a layer's full parameters exist only while that layer computes.

Units: the embeddings, each transformer block, the final layer norm, the head. Per unit:

    forward    pre-hook: all-gather the unit's flat parameters (prefetching the next unit's while this
               one computes, if `prefetch`); post-hook: free them.
    backward   when the gradient of the unit's output arrives (a tensor hook): all-gather again
               (prefetching the unit before it); when the last of its parameters has its gradient
               (post-accumulate-grad hooks): copy the gradients into a buffer, free them and the
               parameters, and reduce-scatter the buffer so each rank keeps the sum of its slice.
    step       AdamW on the slices. Nothing to gather: the next forward does.

Collectives per step: all-gather Ψ (forward) + all-gather Ψ (backward) + reduce-scatter Ψ = 3Ψ,
1.5 × data parallelism's 2Ψ. Memory categories: `parameter` the slices, `temporary` the gathered
full parameters of the units in use (the saw-tooth), `comm_buffer` gradients in flight.

Freeing resizes the flat buffer's storage to zero and gathering resizes it back and fills it in place:
the tensors autograd saved for backward share that storage, so they see the parameters again when
backward needs them (FSDP's approach).

`Zero3DataParallel` is the `GradSync`, built from the model's units (`GPT.units()`: the model says its
pieces); the update is `ShardedAdamWUpdater(shards=..., facts=shard_facts)`, and `gather_params` after the
step does nothing (the next forward gathers). Each unit reduce-scatters after every backward, so
`no_sync()` changes nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
from torch import nn

from workbench.comm.traced import Communicator, Handle
from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.parallel.flat import flatten_params, grad_of, pack_grads
from workbench.parallel.grad_sync import SyncToggle
from workbench.parallel.param_facts import ParamFacts, ParamTable
from workbench.parallel.zero import MAX_IN_FLIGHT, OnReduced, decay_runs


@dataclass(kw_only=True)
class Unit:
    index: int
    name: str
    module: nn.Module
    params: list[nn.Parameter]
    flat: torch.Tensor  # full parameters (padded); storage resized to 0 while not in use
    shard: nn.Parameter  # this rank's slice: the master copy AdamW updates
    nbytes: int = 0
    gathered: bool = False
    gather_handle: Handle | None = None
    ready: int = 0


@dataclass(kw_only=True)
class _ReduceScatter:
    """A unit's gradients in flight: the full-size staging copy and the slice it lands in."""

    unit: Unit
    handle: Handle
    result: torch.Tensor
    staging: torch.Tensor

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.result, self.staging))


class Zero3DataParallel(SyncToggle):
    """Owns each unit's flat buffer and this rank's slice of it; is handed the units (the model's), the
    communicator, the parameters' facts (which elements decay), the memory tracker (gathered units under
    `temporary`, gradients in flight under `comm_buffer`) and, for ZeRO-Offload, `on_reduced`."""

    def __init__(
        self,
        units: list[tuple[str, nn.Module]],
        comm: Communicator,
        *,
        prefetch: bool = True,
        group: str = "dp",
        facts: ParamTable | None = None,
        memory: MemoryCounter = NO_MEMORY,
        on_reduced: OnReduced | None = None,
    ) -> None:
        self.comm, self.prefetch, self.memory, self.on_reduced = comm, prefetch, memory, on_reduced
        self.group = group  # "dp", or "dp_cp" under context parallelism: the ranks holding the same parameters
        self.n, self.r = comm.size(group), comm.index(group)
        if facts is None:  # built on its own: every parameter plain
            facts = ParamTable.plain(p for _, module in units for p in module.parameters())
        self.units: list[Unit] = []
        self._unit_of: dict[nn.Parameter, Unit] = {}
        self._in_flight: deque[_ReduceScatter] = deque()
        shard_facts: dict[torch.Tensor, ParamFacts] = {}
        for i, (name, module) in enumerate(units):
            params = [p for p in module.parameters() if p.requires_grad]
            flat = flatten_params(params, multiple=self.n)
            per = flat.numel() // self.n
            mine = slice(self.r * per, (self.r + 1) * per)
            shard = nn.Parameter(flat[mine].clone())
            # its matrices' elements decay; the norm sums its squares over the group it was cut over
            shard_facts[shard] = ParamFacts(
                zero_group=group, decay_ranges=decay_runs(params, facts, mine)
            )
            shard.grad = torch.zeros_like(shard)
            unit = Unit(
                index=i,
                name=name,
                module=module,
                params=params,
                flat=flat,
                shard=shard,
                nbytes=flat.numel() * flat.element_size(),
            )
            self._free(unit)
            for p in params:
                self._unit_of[p] = unit
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
            module.register_forward_pre_hook(lambda m, args, u=unit: self._before_forward(u))
            module.register_forward_hook(lambda m, args, out, u=unit: self._after_forward(u, out))
            self.units.append(unit)
        #: each slice's facts: the group it was cut over, the runs of its matrices' elements
        self.shard_facts = ParamTable(shard_facts)

    @property
    def shards(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units]

    def gather_params(self) -> None:
        """After the update: nothing — the next forward gathers each unit as it needs it."""
        return None

    # ---- gather and free -----------------------------------------------------------------------------
    def _gather(self, unit: Unit, async_op: bool, why: str) -> None:
        if unit.gathered or unit.gather_handle is not None:
            return
        unit.flat.untyped_storage().resize_(unit.nbytes)
        self.memory.add("temporary", unit.nbytes)
        self.memory.not_activation(unit.flat)  # a new allocation each time: its address changes
        h = self.comm.all_gather(
            unit.flat,
            unit.shard.data,
            self.group,
            async_op=async_op,
            label=f"zero3 {unit.name} {why}",
            meta={"layer": unit.name, "direction": why},
        )
        if async_op:
            unit.gather_handle = h
        else:
            unit.gathered = True
        self.memory.snapshot()

    def _ensure(self, unit: Unit, why: str) -> None:
        if unit.gather_handle is not None:
            unit.gather_handle.wait()
            unit.gather_handle = None
            unit.gathered = True
        self._gather(unit, False, why)

    def _free(self, unit: Unit) -> None:
        if unit.flat.untyped_storage().nbytes() == 0:
            return
        self.memory.forget_not_activation(unit.flat)
        unit.flat.untyped_storage().resize_(0)
        if unit.gathered:
            self.memory.add("temporary", -unit.nbytes)
            self.memory.snapshot()
        unit.gathered = False

    # ---- hooks ---------------------------------------------------------------------------------------
    def _before_forward(self, unit: Unit) -> None:
        if not torch.is_grad_enabled():
            return self._ensure(unit, "forward")
        self._ensure(unit, "forward")
        if self.prefetch and unit.index + 1 < len(self.units):
            self._gather(self.units[unit.index + 1], True, "forward")

    def _after_forward(self, unit: Unit, out: torch.Tensor) -> None:
        self._free(unit)
        if torch.is_grad_enabled() and isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, u=unit: self._before_backward(u, grad))

    def _before_backward(self, unit: Unit, grad: torch.Tensor) -> torch.Tensor:
        self._ensure(unit, "backward")
        if self.prefetch and unit.index > 0:
            self._gather(self.units[unit.index - 1], True, "backward")
        return grad

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        unit = self._unit_of[p]
        unit.ready += 1
        if unit.ready < len(unit.params):
            return
        unit.ready = 0
        while len(self._in_flight) >= MAX_IN_FLIGHT:  # bound the full-size copies alive at once
            self._finish_reduce_scatter()
        staging = pack_grads(unit.params, unit.flat)
        staging.div_(self.n)
        self._free(unit)
        out = torch.empty_like(unit.shard)
        h = self.comm.reduce_scatter(
            out,
            staging,
            self.group,
            async_op=True,
            label=f"zero3 {unit.name} grads",
            meta={"layer": unit.name, "direction": "backward"},
        )
        assert h is not None  # async_op=True: the call returns its handle
        self._in_flight.append(_ReduceScatter(unit=unit, handle=h, result=out, staging=staging))
        self.memory.add("comm_buffer", self._in_flight[-1].nbytes)
        self.memory.snapshot()

    def _finish_reduce_scatter(self) -> None:
        """Wait for the oldest reduce-scatter in flight, add this rank's slice, free the staging copy."""
        rs = self._in_flight.popleft()
        rs.handle.wait()
        grad = grad_of(rs.unit.shard)
        grad.add_(rs.result)
        # final: ZeRO-3 reduce-scatters once per step (no accumulation)
        if self.on_reduced is not None:
            self.on_reduced(rs.unit.index, grad)
        freed = rs.nbytes
        del rs  # the staging copy and the slice go now, before the snapshot
        self.memory.add("comm_buffer", -freed)
        self.memory.snapshot()

    # ---- the step ------------------------------------------------------------------------------------
    def wait(self) -> None:
        while self._in_flight:
            self._finish_reduce_scatter()
        for unit in self.units:
            if unit.ready:
                raise RuntimeError(
                    f"zero3 unit {unit.name}: {unit.ready}/{len(unit.params)} gradients arrived; every "
                    f"parameter must receive a gradient each step"
                )
            # a prefetch nobody used (the first unit, in backward)
            if unit.gather_handle is not None:
                unit.gather_handle.wait()
                unit.gather_handle, unit.gathered = None, True
            self._free(unit)

    def zero_grad(self) -> None:
        for u in self.units:
            grad_of(u.shard).zero_()

    def grad_tensors(self) -> list[torch.Tensor]:
        return [grad_of(u.shard) for u in self.units]
