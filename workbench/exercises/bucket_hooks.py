"""The `dp` that the `buckets` exercise hands the learner's hook (exercises/buckets.py): the model's gradient
buckets — in reverse parameter order, the order backward fills them, cut as parallel/data_parallel.py cuts them
(config/buckets.plan_buckets), each parameter's `.grad` a view of its bucket's flat buffer — and
`all_reduce(bucket)`, which records how full the bucket was when it was launched and hands it on (to the traced
communicator on a rank, to nothing in the in-process check)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass(kw_only=True, eq=False)
class Bucket:
    """One bucket: consecutive parameters in backward order whose gradients are views of one flat buffer.
    `ready` is the learner's to fill; the workbench empties it before each backward."""

    index: int
    params: list[nn.Parameter]
    names: list[str]
    buffer: torch.Tensor
    ready: set[nn.Parameter] = field(default_factory=set)

    def __repr__(self) -> str:
        return f"Bucket(index={self.index}, params={len(self.params)}, ready={len(self.ready)})"


@dataclass(kw_only=True)
class Launch:
    """What `dp.all_reduce(bucket)` saw: how many of the bucket's gradients had arrived, and when."""

    bucket: int
    arrived: int
    missing: list[str]
    snapshot: torch.Tensor


class BucketHooks:
    """The `dp` a learner's hook is handed: the model's buckets, and `all_reduce(bucket)`, which records the
    launch and hands the bucket to `launch` (the traced communicator on a rank; nothing in the in-process
    check). It registers the hook on every parameter and keeps its own count of the gradients that
    arrived, independent of what the learner does with `bucket.ready`."""

    def __init__(
        self,
        module: nn.Module,
        *,
        size: int,
        launch: Callable[[Bucket], Any],
        clock: Callable[[], float],
        bucket_mb: float,
    ) -> None:
        from workbench.config.buckets import plan_buckets
        from workbench.parallel.flat import empty_flat, grads_as_views

        self.size, self._launch, self._clock = size, launch, clock
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        named.reverse()  # backward produces the last layers' gradients first
        plan = plan_buckets([p.numel() for _, p in named], 4, bucket_mb)
        self.buckets: list[Bucket] = []
        self._bucket_of: dict[nn.Parameter, Bucket] = {}
        for b, idxs in enumerate(plan):
            params = [named[i][1] for i in idxs]
            bucket = Bucket(
                index=b, params=params, names=[named[i][0] for i in idxs], buffer=empty_flat(params)
            )
            grads_as_views(params, bucket.buffer)
            self.buckets.append(bucket)
            self._bucket_of.update((p, bucket) for p in params)
        self.fn: Callable[[nn.Parameter, BucketHooks], None] | None = None
        self.arrived: list[nn.Parameter] = []
        self.last_arrival = 0.0
        self.launches: list[Launch] = []
        self.handles: list[Any] = []
        for _, p in named:
            p.register_post_accumulate_grad_hook(self._on_gradient)

    def bucket_of(self, param: nn.Parameter) -> Bucket:
        """The bucket that holds `param`'s gradient."""
        return self._bucket_of[param]

    def all_reduce(self, bucket: Bucket) -> None:
        """Launch the sum of `bucket`'s gradients over the ranks; it completes after backward."""
        if not isinstance(bucket, Bucket) or bucket not in self.buckets:
            raise TypeError(
                f"dp.all_reduce takes a bucket (dp.bucket_of(param) or one of dp.buckets), got "
                f"{type(bucket).__name__}"
            )
        came = {id(p) for p in self.arrived}
        pairs = zip(bucket.names, bucket.params, strict=True)
        self.launches.append(
            Launch(
                bucket=bucket.index,
                arrived=sum(id(p) in came for p in bucket.params),
                missing=[name for name, p in pairs if id(p) not in came],
                snapshot=bucket.buffer.clone(),
            )
        )
        self.handles.append(self._launch(bucket))

    def _on_gradient(self, param: nn.Parameter) -> None:
        self.last_arrival = self._clock()
        self.arrived.append(param)
        if self.fn is not None:
            self.fn(param, self)

    def start(self) -> None:
        """Before a backward: nothing arrived, nothing launched, every `ready` empty."""
        self.arrived, self.launches, self.handles = [], [], []
        for bucket in self.buckets:
            bucket.ready = set()

    def finish(self) -> None:
        """After backward: wait for every launched all-reduce."""
        for handle in self.handles:
            if handle is not None:
                handle.wait()
        never = [b.index for b in self.buckets if all(x.bucket != b.index for x in self.launches)]
        if never:
            raise RuntimeError(f"buckets {never} were never launched: their gradients stayed local")

    def replaced(self) -> list[str]:
        """The parameters whose `.grad` is no longer the view of its bucket (a new tensor assigned to it): the
        all-reduce would never see what is in it."""
        from workbench.parallel.flat import views

        return [
            name
            for b in self.buckets
            for name, p, view in zip(b.names, b.params, views(b.buffer, b.params), strict=True)
            if p.grad is None or p.grad.data_ptr() != view.data_ptr()
        ]

    def zero_grad(self) -> None:
        for bucket in self.buckets:
            bucket.buffer.zero_()
