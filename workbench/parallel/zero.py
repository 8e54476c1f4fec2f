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
              its slice (4Ψ/N) plus the buckets in flight.
    both      AdamW updates only the rank's slices (its moments: 8Ψ/N in fp32), then each bucket's
              updated slices are all-gathered back into the full parameters.

Collectives per step: reduce-scatter of the gradients (Ψ values) and all-gather of the parameters
(Ψ values) — the same 2Ψ a data-parallel all-reduce moves (an all-reduce is a reduce-scatter then an
all-gather), with the optimizer states divided by N.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.comm.traced import Communicator, Handle
from workbench.parallel.data_parallel import plan_buckets


def padded(numel: int, n: int) -> int:
    """numel rounded up to a multiple of n (each rank's slice has the same size)."""
    return -(-numel // n) * n


def sharded_grad_norm_sq(shards: list[nn.Parameter], comm: Communicator) -> torch.Tensor:
    """Squared norm of the whole gradient when each rank holds disjoint slices of it: the slices'
    squares summed over dp (padding is zero, so it adds nothing)."""
    sq = sum((s.grad.float().pow(2).sum() for s in shards), torch.zeros((), device=shards[0].device))
    sq = sq.reshape(1).clone()
    comm.all_reduce(sq, "dp", label="zero grad norm")
    return sq[0]


@dataclass
class ZeroBucket:
    index: int
    params: list[nn.Parameter]
    flat: torch.Tensor  # the full parameters, padded; every parameter's .data is a view into it
    shard: nn.Parameter  # this rank's slice of `flat`, the tensor AdamW updates
    grad: torch.Tensor | None = None  # stage 1: full gradient buffer (views are the params' .grad)
    staging: torch.Tensor | None = None  # stage 2: the gradients in flight
    handle: Handle | None = None
    ready: int = 0
    names: list[str] = field(default_factory=list)


class ZeroDataParallel:
    """Stages 1 and 2 as a gradient synchroniser with its own sharded optimizer."""

    def __init__(self, model: nn.Module, comm: Communicator, stage: int, bucket_mb: float, lr: float,
                 weight_decay: float) -> None:
        assert stage in (1, 2)
        self.comm, self.stage = comm, stage
        self.n, self.r = comm.size("dp"), comm.groups.index("dp")
        self.enabled = True  # stage 1 syncs once per step anyway; stage 2 reduces after every backward
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        named.reverse()
        plan = plan_buckets([p.numel() for _, p in named], 4, bucket_mb)
        self.buckets: list[ZeroBucket] = []
        self._bucket_of: dict[nn.Parameter, ZeroBucket] = {}
        for b, idxs in enumerate(plan):
            members = [named[i] for i in idxs]
            total = padded(sum(p.numel() for _, p in members), self.n)
            flat = torch.zeros(total, dtype=members[0][1].dtype, device=members[0][1].device)
            offset = 0
            for _, p in members:
                flat[offset:offset + p.numel()].copy_(p.data.view(-1))
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            per = total // self.n
            mine = slice(self.r * per, (self.r + 1) * per)
            shard = nn.Parameter(flat[mine])  # a view: AdamW updates this rank's slice in place
            bucket = ZeroBucket(b, [p for _, p in members], flat, shard, names=[n for n, _ in members])
            if stage == 1:
                bucket.grad = torch.zeros_like(flat)
                shard.grad = bucket.grad[mine]  # the reduce-scatter lands in place, in the full buffer
                offset = 0
                for _, p in members:
                    p.grad = bucket.grad[offset:offset + p.numel()].view_as(p)
                    offset += p.numel()
            else:
                shard.grad = torch.zeros_like(shard)
                for _, p in members:
                    p.register_post_accumulate_grad_hook(self._on_grad_ready)
            for _, p in members:
                self._bucket_of[p] = bucket
            self.buckets.append(bucket)
        self.optimizer = torch.optim.AdamW([b.shard for b in self.buckets], lr=lr, weight_decay=weight_decay,
                                           foreach=False)

    # ---- stage 2: reduce-scatter during backward ---------------------------------------------------
    def _on_grad_ready(self, p: nn.Parameter) -> None:
        bucket = self._bucket_of[p]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            bucket.ready = 0
            self._launch(bucket)

    def _launch(self, bucket: ZeroBucket) -> None:
        """Copy the bucket's gradients into a staging buffer, free them, reduce-scatter the buffer."""
        staging = torch.zeros_like(bucket.flat)
        offset = 0
        for p in bucket.params:
            staging[offset:offset + p.numel()].copy_(p.grad.view(-1))
            p.grad = None  # the full gradient is gone: only this rank's slice will remain
            offset += p.numel()
        staging.div_(self.n)
        self._finish_bucket(bucket)  # at most one reduce-scatter in flight per bucket
        bucket.staging = staging
        if self.comm.memory is not None:
            self.comm.memory.add("comm_buffer", staging.numel() * staging.element_size())
            self.comm.memory.snapshot()
        out = torch.empty_like(bucket.shard)
        bucket.handle = self.comm.reduce_scatter(out, staging, "dp", async_op=True,
                                                 label=f"zero2 bucket {bucket.index}")
        bucket.handle.result = out  # type: ignore[attr-defined]

    def _finish_bucket(self, bucket: ZeroBucket) -> None:
        if bucket.handle is None:
            return
        bucket.handle.wait()
        bucket.shard.grad.add_(bucket.handle.result)  # type: ignore[attr-defined]
        if self.comm.memory is not None and bucket.staging is not None:
            self.comm.memory.add("comm_buffer", -bucket.staging.numel() * bucket.staging.element_size())
        bucket.handle, bucket.staging = None, None

    # ---- the step ------------------------------------------------------------------------------------
    def finish(self) -> None:
        """After backward: every rank holds the summed gradient of its slices."""
        for bucket in self.buckets:
            if self.stage == 1:
                bucket.grad.div_(self.n)
                self.comm.reduce_scatter(bucket.shard.grad, bucket.grad, "dp", label=f"zero1 bucket {bucket.index}")
            else:
                if bucket.ready:
                    raise RuntimeError(f"zero2 bucket {bucket.index}: {bucket.ready}/{len(bucket.params)} gradients "
                                       f"arrived; every parameter must receive a gradient each step")
                self._finish_bucket(bucket)

    def grad_norm_sq(self) -> torch.Tensor:
        return sharded_grad_norm_sq([b.shard for b in self.buckets], self.comm)

    def clip(self, coef: torch.Tensor) -> None:
        for b in self.buckets:
            b.shard.grad.mul_(coef)

    def step(self) -> None:
        """AdamW on this rank's slices, then all-gather every bucket's slices into the full parameters."""
        self.optimizer.step()
        for b in self.buckets:
            self.comm.all_gather(b.flat, b.shard.data, "dp", label=f"zero params bucket {b.index}")

    def zero_grad(self) -> None:
        for b in self.buckets:
            b.shard.grad.zero_()
            if b.grad is not None:
                b.grad.zero_()

    def grad_tensors(self) -> list[torch.Tensor]:
        """What the gradient category holds: full buffers (stage 1) and the rank's slices."""
        full = [b.grad for b in self.buckets if b.grad is not None]
        return full + [b.shard.grad for b in self.buckets]
