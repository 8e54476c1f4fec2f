"""Data parallelism: every rank holds the whole model, takes 1/N of the global batch, and the
gradients are averaged over the N ranks before each optimizer step (Li et al. 2020, "PyTorch
Distributed: Experiences on Accelerating Data Parallel Training", the design of torch DDP).

Sharded: the batch (rows), nothing of the model. Collective: one all-reduce (sum) of the gradients
over the `dp` group in backward; nothing in forward. Each rank divides by N before the sum, so the
result is the gradient of the mean loss over the global batch — the single-process gradient.

Two implementations:

- `NaiveDataParallel` (for teaching): after backward, one blocking all-reduce per parameter. Simple,
  but every small tensor pays the full latency and nothing overlaps backward.
- `BucketedDataParallel` (the real one): gradients live in flat buckets of about `bucket_mb`
  megabytes (each parameter's `.grad` is a view into its bucket, so there is no copy). Buckets are
  filled in reverse layer order — the order backward produces gradients — and the moment a bucket's
  last gradient is accumulated its all-reduce is launched asynchronously, so communication overlaps
  the rest of backward. `wait()` waits for every bucket before the optimizer step. With
  algorithm='ring' each bucket runs our send/recv ring instead (blocking: a teaching path).

Both are `GradSync`s (parallel/grad_sync.py): inside `no_sync()` backward only accumulates. Given a
`grad_dtype` other than the parameters' (fp32 for a 16-bit model), the gradients accumulate and are
all-reduced in that dtype, as each parameter's main gradient (parallel/main_grad.MainGrads, which the
strategy hands in and the updater reads).

Gradient compression (`compression=torch.bfloat16 | torch.float16`, as torch DDP's `bf16_compress_hook` /
`fp16_compress_hook`): each bucket is cast to 16 bits, divided by N there (fp16 needs the division before
the sum, or it overflows sooner), all-reduced — half the bytes on the wire — and cast back into the fp32
bucket in `wait()`. The 16-bit copies are `comm_buffer` while they are in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.comm.hierarchical import hierarchical_all_reduce
from workbench.comm.ring_allreduce import ring_all_reduce
from workbench.comm.traced import Communicator, Handle
from workbench.config.buckets import plan_buckets
from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.parallel.flat import empty_flat, grads_as_views
from workbench.parallel.grad_sync import SyncToggle
from workbench.parallel.main_grad import MainGrads, uses_main_grads


class NaiveDataParallel(SyncToggle):
    """Syncs in `wait()` only, after the last backward, so `no_sync()` has nothing to hold back.

    Given a `grad_dtype` other than the parameters', it gives each parameter a main gradient of that dtype in
    `main_grads` (the strategy's, which the updater reads; a new one if none is handed in)."""

    def __init__(
        self,
        model: nn.Module,
        comm: Communicator,
        *,
        grad_dtype: torch.dtype | None = None,
        group: str = "dp",
        main_grads: MainGrads | None = None,
    ) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.comm = comm
        self.group = group  # "dp", or "dp_cp" under context parallelism (config/grid.py)
        self.n = comm.size(group)
        self.main_grads = MainGrads() if main_grads is None else main_grads
        if grad_dtype is not None and uses_main_grads(self.params, grad_dtype):
            self.main_grads.allocate(self.params, grad_dtype)
            for p in self.params:
                p.register_post_accumulate_grad_hook(self.main_grads.accumulate)

    def wait(self) -> None:
        """One all-reduce per parameter, after the whole backward."""
        if self.n == 1:
            return
        for i, p in enumerate(self.params):
            grad = self.main_grads.grad_of(p)
            assert grad is not None, f"parameter {i} has no gradient"
            grad.div_(self.n)
            self.comm.all_reduce(grad, self.group, label=f"param {i}")

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.main_grads.zero_(self.params)

    def grad_tensors(self) -> list[torch.Tensor | None]:
        return [self.main_grads.grad_of(p) for p in self.params]


@dataclass(kw_only=True)
class Bucket:
    """A flat gradient buffer shared by consecutive parameters (in backward order)."""

    index: int
    buffer: torch.Tensor
    params: list[nn.Parameter]
    ready: int = 0
    handle: Handle | None = None
    wire: torch.Tensor | None = None  # the compressed copy on the wire
    launched: bool = False
    names: list[str] = field(default_factory=list)


class BucketedDataParallel(SyncToggle):
    """Owns the gradient buckets (and, for a 16-bit model with fp32 reduction, the main gradients in
    them, registered in `main_grads`); is handed the communicator and the memory tracker, which counts
    the compressed copies on the wire."""

    def __init__(
        self,
        model: nn.Module,
        comm: Communicator,
        *,
        bucket_mb: float = 25.0,
        algorithm: str = "backend",
        grad_dtype: torch.dtype | None = None,
        compression: torch.dtype | None = None,
        group: str = "dp",
        only: list[tuple[str, nn.Parameter]] | None = None,
        average_over: int | None = None,
        main_grads: MainGrads | None = None,
        memory: MemoryCounter = NO_MEMORY,
    ) -> None:
        """`group`: "dp", "dp_cp" under context parallelism, "edp" for expert parallelism's experts (config/grid.py);
        `only`: these of the model's parameters (expert parallelism syncs experts and the rest apart);
        `average_over`: the divisor of the sum (the group's size; dp for experts reduced over edp)."""
        self.comm, self.group, self.memory = comm, group, memory
        self.main_grads = MainGrads() if main_grads is None else main_grads
        self.n = comm.size(group)
        self.divisor = average_over or self.n
        #: whether backward's gradients need anything: a sum over the group, or a division (expert parallelism's
        #: experts on an edp group of one rank are still averaged over dp)
        self.acts = self.n > 1 or self.divisor != 1
        self.algorithm, self.compression = algorithm, compression
        named = [
            (name, p)
            for name, p in (only if only is not None else model.named_parameters())
            if p.requires_grad
        ]
        named.reverse()  # backward produces the last layers' gradients first
        self.main = uses_main_grads([p for _, p in named], grad_dtype)
        dtype = grad_dtype if grad_dtype is not None and self.main else named[0][1].dtype
        plan = plan_buckets([p.numel() for _, p in named], dtype.itemsize, bucket_mb)
        self.buckets: list[Bucket] = []
        self._bucket_of: dict[nn.Parameter, Bucket] = {}
        for b, idxs in enumerate(plan):
            params = [named[i][1] for i in idxs]
            bucket = Bucket(
                index=b,
                buffer=empty_flat(params, dtype=dtype),
                params=params,
                names=[named[i][0] for i in idxs],
            )
            # each gradient is a view of its bucket: no copy (16-bit model: the fp32 main gradient is)
            if self.main:
                self.main_grads.as_views(params, bucket.buffer)
            else:
                grads_as_views(params, bucket.buffer)
            for p in params:
                self._bucket_of[p] = bucket
                # else nothing to do: no hook (a 16-bit model's main gradient add only)
                if self.acts:
                    p.register_post_accumulate_grad_hook(self._on_grad_ready)
                elif self.main:
                    p.register_post_accumulate_grad_hook(self.main_grads.accumulate)
            self.buckets.append(bucket)
        self._next_launch = 0
        #: gradients stay on each rank (1-bit Adam after its warm-up reduces the momentum instead)
        self.local_only = False

    def keep_gradients_local(self) -> None:
        """From now on no bucket is reduced: each rank keeps its own gradients (1-bit Adam's compressed
        momentum replaces the all-reduce once its warm-up ends: optim/onebit_adam.py)."""
        self.local_only = True

    def _on_grad_ready(self, p: nn.Parameter) -> None:
        # a 16-bit gradient goes into its fp32 main gradient (or nothing)
        self.main_grads.accumulate(p)
        if not self.enabled:  # an earlier microbatch's backward: keep accumulating, do not sync yet
            return
        bucket = self._bucket_of[p]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            # Launch in bucket order, so every rank issues the same collectives in the same order.
            while self._next_launch < len(self.buckets):
                nxt = self.buckets[self._next_launch]
                if nxt.ready < len(nxt.params):
                    break
                self._launch(nxt)
                self._next_launch += 1

    def _launch(self, bucket: Bucket) -> None:
        bucket.launched = True
        if self.local_only:
            return
        wire = bucket.buffer
        # cast, then divide in 16 bits (DDP's hooks)
        if self.compression is not None and self.n > 1:
            wire = bucket.wire = bucket.buffer.to(self.compression)
            self._count_wire(bucket, +1)
        if self.divisor != 1:
            wire.div_(self.divisor)
        if self.n == 1:
            return
        label = f"bucket {bucket.index}"
        if self.algorithm == "ring":
            ring_all_reduce(self.comm, wire, self.group, label=label)
        elif self.algorithm == "hierarchical":
            hierarchical_all_reduce(self.comm, wire, label=label)
        else:
            bucket.handle = self.comm.all_reduce(wire, self.group, async_op=True, label=label)

    def _count_wire(self, bucket: Bucket, sign: int) -> None:
        wire = bucket.wire
        assert wire is not None
        self.memory.add("comm_buffer", sign * wire.numel() * wire.element_size())
        self.memory.snapshot()

    def wait(self) -> None:
        """Wait for every bucket's all-reduce; call after backward, before the optimizer step (one rank: nothing
        was launched, nothing to wait for)."""
        if not self.acts:
            return
        for bucket in self.buckets:
            if not bucket.launched:
                missing = [
                    n
                    for n, p in zip(bucket.names, bucket.params, strict=True)
                    if p.grad is None and not self.main
                ]
                raise RuntimeError(
                    f"bucket {bucket.index} never became ready ({bucket.ready}/{len(bucket.params)} gradients); "
                    f"parameters without gradient this step: {missing or 'unknown'}"
                )
            if bucket.handle is not None:
                bucket.handle.wait()
                bucket.handle = None
            if bucket.wire is not None:  # decompress into the fp32 bucket
                bucket.buffer.copy_(bucket.wire)
                self._count_wire(bucket, -1)
                bucket.wire = None
        for bucket in self.buckets:
            bucket.ready, bucket.launched = 0, False
        self._next_launch = 0

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.buffer.zero_()

    def grad_tensors(self) -> list[torch.Tensor]:
        return [b.buffer for b in self.buckets]
