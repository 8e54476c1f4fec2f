"""ZeRO stages 1 and 2 (Rajbhandari et al. 2020, arXiv 1910.02054): the optimizer states — and in
stage 2 the gradients — are partitioned over the N data-parallel ranks.

Layout: the parameters, in backward order, are packed into flat buckets (as for data parallelism;
each parameter's `.data` becomes a view into its bucket). Each bucket is padded with zeros to a
multiple of N, and rank r owns the r-th 1/N slice of every bucket — its *partition*. Padding is at most
N − 1 elements per bucket (reported in `summary.json`'s figures; a few bytes against megabytes).

    stage 1   gradients: full buffers on every rank (4Ψ), accumulated through backward; after backward
              each bucket is reduce-scattered, so rank r receives the sum of its slice.
    stage 2   gradients: as soon as a bucket's gradients are complete in backward they are copied into
              a staging buffer, freed, and the buffer reduce-scattered asynchronously; a rank keeps only
              its slice (4Ψ/N) plus at most MAX_IN_FLIGHT buckets in flight: launching one more first
              waits for the oldest and frees its staging buffer (DeepSpeed's bounded reduce buckets).
              With gradient accumulation each microbatch's backward reduce-scatters (the full gradient
              is never kept), so the reduce-scatter bytes are m times a step's gradient.
    both      AdamW updates only the rank's slices (its moments: 8Ψ/N in fp32), then each bucket's
              updated slices are all-gathered back into the full parameters.

Collectives per step: reduce-scatter of the gradients (Ψ values) and all-gather of the parameters
(Ψ values) — the same 2Ψ a data-parallel all-reduce moves (an all-reduce is a reduce-scatter then an
all-gather), with the optimizer states divided by N.

`ZeroDataParallel` is the `GradSync` (after `wait()` each rank holds the summed gradient of its slices,
`shards`, whose facts — the group they were cut over, the runs of matrix elements that decay — are
`shard_facts`); the update is `optim.updater.ShardedAdamWUpdater(shards=..., facts=shard_facts,
after_step=gather_params)`. ZeRO-Offload's copy of each final slice to the host is the `on_reduced`
callback it is built with.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from workbench.comm.ring_primitives import ring_all_gather, ring_reduce_scatter
from workbench.comm.traced import Communicator, Handle
from workbench.config.buckets import plan_buckets
from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.parallel.flat import (
    flatten_params,
    grad_of,
    grads_as_views,
    marked_runs,
    pack_grads,
)
from workbench.parallel.grad_sync import ChainedGradSync, SyncToggle
from workbench.parallel.param_facts import ParamFacts, ParamTable, Ranges, merged

#: called with a slice's index and its gradient once this rank's slice is final (ZeRO-Offload copies it to
#: the host then: optim/offload.py)
OnReduced = Callable[[int, torch.Tensor], None]

#: buckets (ZeRO-3: units) whose full-size gradient copy may be in flight at once; the memory formula
#: (predict/formulas/memory.py, ZERO_IN_FLIGHT) counts the same number, a test holds them equal
MAX_IN_FLIGHT = 2


@dataclass(kw_only=True)
class _InFlight:
    """A stage-2 bucket's gradients in flight: the full-size staging copy, the slice it lands in, the handle."""

    staging: torch.Tensor
    result: torch.Tensor
    handle: Handle

    @property
    def nbytes(self) -> int:
        return _nbytes(self.staging) + _nbytes(self.result)


@dataclass(kw_only=True)
class ZeroBucket:
    index: int
    params: list[nn.Parameter]
    flat: torch.Tensor  # the full parameters, padded; every parameter's .data is a view into it
    shard: nn.Parameter  # this rank's slice of `flat`, the tensor AdamW updates
    mine: slice  # where the slice sits in `flat`
    grad: torch.Tensor | None = None  # stage 1: full gradient buffer (views are the params' .grad)
    # stage 2: the bucket's reduce-scatter, launched and not waited for
    in_flight: _InFlight | None = None
    ready: int = 0
    names: list[str] = field(default_factory=list)


class ZeroDataParallel(SyncToggle):
    """Stages 1 and 2 as a gradient synchroniser; stage 2 reduces after every backward, so `no_sync()`
    changes nothing (and stage 1 reduces once, in `wait()`). Owns the flat buckets and this rank's slices of
    them; is handed the communicator, the parameters' facts (which elements decay), the memory tracker
    (the stage-2 copies in flight) and, for ZeRO-Offload, `on_reduced`."""

    def __init__(
        self,
        model: nn.Module,
        comm: Communicator,
        *,
        stage: int,
        bucket_mb: float,
        ring: bool = False,
        group: str = "dp",
        only: list[tuple[str, nn.Parameter]] | None = None,
        average_over: int | None = None,
        facts: ParamTable | None = None,
        memory: MemoryCounter = NO_MEMORY,
        on_reduced: OnReduced | None = None,
    ) -> None:
        """`group`: the ranks holding the same parameters ("dp", "dp_cp", or "edp" for expert parallelism's
        experts); `only`: these of the model's parameters; `average_over`: the divisor of the sum (the
        group's size; dp for experts, whose tokens came from all of dp); `facts`: the parameters' (None:
        every one plain)."""
        assert stage in (1, 2) and not (ring and stage == 2)
        self.comm, self.stage, self.memory, self.on_reduced = comm, stage, memory, on_reduced
        # stage 1 with ring=True: our send/recv rings (comm/ring_primitives.py) instead of the backend's
        self.reduce_scatter = partial(ring_reduce_scatter, comm) if ring else comm.reduce_scatter
        self.all_gather = partial(ring_all_gather, comm) if ring else comm.all_gather
        self.group = group  # "dp", or "dp_cp" under context parallelism: the ranks holding the same parameters
        self.n, self.r = comm.size(group), comm.index(group)
        self.divisor = average_over or self.n
        named = [
            (name, p)
            for name, p in (only if only is not None else model.named_parameters())
            if p.requires_grad
        ]
        named.reverse()
        # built on its own (no facts): every parameter plain
        self.facts = ParamTable.plain(p for _, p in named) if facts is None else facts
        plan = plan_buckets([p.numel() for _, p in named], 4, bucket_mb)
        self.buckets = [self._bucket(b, [named[i] for i in idxs]) for b, idxs in enumerate(plan)]
        #: each slice's facts: the group it was cut over, the runs of its matrices' elements (they decay)
        self.shard_facts = ParamTable(
            {
                b.shard: ParamFacts(
                    zero_group=self.group, decay_ranges=decay_runs(b.params, self.facts, b.mine)
                )
                for b in self.buckets
            }
        )
        self._bucket_of = {p: bucket for bucket in self.buckets for p in bucket.params}
        self._in_flight: deque[ZeroBucket] = deque()

    def _bucket(self, index: int, members: list[tuple[str, nn.Parameter]]) -> ZeroBucket:
        params = [p for _, p in members]
        flat = flatten_params(params, multiple=self.n)
        per = flat.numel() // self.n
        mine = slice(self.r * per, (self.r + 1) * per)
        shard = nn.Parameter(flat[mine])  # a view: AdamW updates this rank's slice in place
        bucket = ZeroBucket(
            index=index,
            params=params,
            flat=flat,
            shard=shard,
            mine=mine,
            names=[n for n, _ in members],
        )
        if self.stage == 1:
            bucket.grad = torch.zeros_like(flat)
            shard.grad = bucket.grad[mine]  # the reduce-scatter lands in place, in the full buffer
            grads_as_views(params, bucket.grad)
        else:
            shard.grad = torch.zeros_like(shard)
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
        return bucket

    @property
    def shards(self) -> list[nn.Parameter]:
        return [b.shard for b in self.buckets]

    # ---- stage 2: reduce-scatter during backward ---------------------------------------------------
    def _on_grad_ready(self, p: nn.Parameter) -> None:
        bucket = self._bucket_of[p]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            bucket.ready = 0
            self._launch(bucket)

    def _launch(self, bucket: ZeroBucket) -> None:
        """Copy the bucket's gradients into a staging buffer, free them, reduce-scatter the buffer."""
        self._finish_bucket(bucket)  # accumulation: this bucket's previous reduce-scatter first
        while len(self._in_flight) >= MAX_IN_FLIGHT:  # bound the full-size copies alive at once
            self._finish_bucket(self._in_flight[0])
        # the full gradient is gone: only the slice remains
        staging = pack_grads(bucket.params, bucket.flat)
        staging.div_(self.divisor)
        result = torch.empty_like(bucket.shard)
        self.memory.add("comm_buffer", _nbytes(staging) + _nbytes(result))
        self.memory.snapshot()
        self._in_flight.append(bucket)
        handle = self.comm.reduce_scatter(
            result, staging, self.group, async_op=True, label=f"zero2 bucket {bucket.index}"
        )
        assert handle is not None  # async_op=True: the call returns its handle
        bucket.in_flight = _InFlight(staging=staging, result=result, handle=handle)

    def _finish_bucket(self, bucket: ZeroBucket) -> None:
        """Wait for the bucket's reduce-scatter, add this rank's slice, free the staging buffer."""
        flight = bucket.in_flight
        if flight is None:
            return
        flight.handle.wait()
        grad_of(bucket.shard).add_(flight.result)
        freed = flight.nbytes
        bucket.in_flight = None
        del flight  # the staging copy and the slice go now, before the snapshot
        self._in_flight.remove(bucket)
        self.memory.add("comm_buffer", -freed)
        self.memory.snapshot()

    # ---- the step ------------------------------------------------------------------------------------
    def wait(self) -> None:
        """After backward: every rank holds the summed gradient of its slices."""
        for bucket in self.buckets:
            if self.stage == 1:
                full = bucket.grad
                # stage 1's buckets are made with their full gradient buffer
                assert full is not None
                full.div_(self.divisor)
                self.reduce_scatter(
                    grad_of(bucket.shard), full, self.group, label=f"zero1 bucket {bucket.index}"
                )
            else:
                if bucket.ready:
                    raise RuntimeError(
                        f"zero2 bucket {bucket.index}: {bucket.ready}/{len(bucket.params)} gradients "
                        f"arrived; every parameter must receive a gradient each step"
                    )
                self._finish_bucket(bucket)
            if self.on_reduced is not None and bucket.shard.grad is not None:
                self.on_reduced(bucket.index, bucket.shard.grad)

    def gather_params(self) -> None:
        """After the update: all-gather every bucket's slices into the full parameters."""
        for b in self.buckets:
            self.all_gather(b.flat, b.shard.data, self.group, label=f"zero params bucket {b.index}")

    def zero_grad(self) -> None:
        for b in self.buckets:
            grad_of(b.shard).zero_()
            if b.grad is not None:
                b.grad.zero_()

    def grad_tensors(self) -> list[torch.Tensor]:
        """What the gradient category holds: full buffers (stage 1) and the rank's slices."""
        full = [b.grad for b in self.buckets if b.grad is not None]
        return full + [grad_of(b.shard) for b in self.buckets]


def decay_runs(params: Sequence[nn.Parameter], facts: ParamTable, mine: slice) -> Ranges:
    """The runs of the slice `mine` of a flat buffer holding `params` whose parameter decays."""
    decays = [facts[p].decays(p.numel()) for p in params]
    return tuple(marked_runs(params, mine.start, mine.stop, decays))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class ZeroGroups(ChainedGradSync):
    """ZeRO-1/2 over two groups at once — expert parallelism: the dense parameters' slices over dp, the
    experts' over edp (the ranks holding the same experts). The sharded updater sees both slice lists
    (`shards`, and their facts: each slice says its group), and `gather_params` restores both after the
    update."""

    group = "dp"

    def __init__(self, parts: Sequence[ZeroDataParallel]) -> None:
        super().__init__(parts)
        self.zero_parts = list(parts)
        self.shard_facts = merged(*(part.shard_facts for part in parts))

    @property
    def shards(self) -> list[nn.Parameter]:
        return [s for part in self.zero_parts for s in part.shards]

    def gather_params(self) -> None:
        for part in self.zero_parts:
            part.gather_params()
