"""Flat buffers: many parameters (or their gradients) laid end to end in one 1-D tensor, so that one
collective moves them all. Data-parallel buckets, ZeRO buckets, ZeRO-3 units and the tensor-parallel
partial gradients all use it.

    flat = [ p0 (numel 6) | p1 (numel 4) | p2 (numel 2) | padding ]      offsets 0, 6, 10; 12 used

`views(flat, tensors)` gives, for each tensor, the slice of `flat` shaped like it — no copy. Assigning
those views to `p.data` or `p.grad` makes the parameters *live* in the flat buffer (PyTorch DDP's
`gradient_as_bucket_view`, FSDP's flat parameter). `pack` and `unpack` copy when the tensors must keep
their own storage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)


def padded(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple` (so that each of that many ranks gets an equal slice)."""
    return -(-n // multiple) * multiple


def views(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """For each tensor, the consecutive slice of `flat` shaped like it (no copy)."""
    out, offset = [], 0
    for t in tensors:
        out.append(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


def empty_flat(
    tensors: Sequence[torch.Tensor], multiple: int = 1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A zeroed buffer big enough for `tensors`, padded to a multiple of `multiple`, on their device,
    with their dtype unless `dtype` is given."""
    first = tensors[0]
    return torch.zeros(
        padded(numel(tensors), multiple), dtype=dtype or first.dtype, device=first.device
    )


def pack(
    tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None, multiple: int = 1
) -> torch.Tensor:
    """Copy `tensors` end to end into `out` (a new zeroed buffer padded to `multiple` if not given)."""
    out = empty_flat(tensors, multiple) if out is None else out
    for view, t in zip(views(out, tensors), tensors, strict=True):
        view.copy_(t)
    return out


def unpack(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy the slices of `flat` back into `tensors` (the inverse of `pack`)."""
    for view, t in zip(views(flat, tensors), tensors, strict=True):
        t.copy_(view)


def flatten_params(params: Sequence[torch.nn.Parameter], multiple: int = 1) -> torch.Tensor:
    """Move the parameters' values into one padded flat buffer and make each `p.data` a view of it."""
    flat = pack([p.data for p in params], multiple=multiple)
    for p, view in zip(params, views(flat, params), strict=True):
        p.data = view
    return flat


def grads_as_views(params: Sequence[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Make each `p.grad` a view of `flat`: backward accumulates straight into the buffer."""
    for p, view in zip(params, views(flat, params), strict=True):
        p.grad = view


def grad_of(p: torch.Tensor) -> torch.Tensor:
    """`p.grad`, where the caller knows it is there (a parameter whose gradient arrived, a slice whose gradient its
    synchroniser made and keeps): a missing one is a bug, said here rather than as a None deeper down."""
    if p.grad is None:
        raise RuntimeError(f"a tensor of shape {tuple(p.shape)} has no gradient")
    return p.grad


def pack_grads(params: Sequence[torch.nn.Parameter], like: torch.Tensor) -> torch.Tensor:
    """Copy the parameters' gradients into a new buffer shaped like `like` and free them (`p.grad = None`):
    after this, the flat copy is the only full gradient (ZeRO-2 and ZeRO-3)."""
    out = torch.zeros_like(like)
    for view, p in zip(views(out, params), params, strict=True):
        view.copy_(grad_of(p))
        p.grad = None
    return out


def marked_runs(
    params: Sequence[torch.Tensor], start: int, end: int, marked: Sequence[bool]
) -> list[tuple[int, int]]:
    """The runs of the slice [start, end) of a flat buffer holding `params` end to end whose parameter is
    `marked` (one flag per parameter; the padding after them: no), in the slice's own coordinates, neighbours
    merged. A ZeRO slice's facts keep them as `decay_ranges` (parallel/param_facts.py): weight decay shrinks
    only its matrices' elements (optim/weight_decay.py)."""
    runs: list[tuple[int, int]] = []
    offset = 0
    for p, mark in zip(params, marked, strict=True):
        lo, hi = max(offset, start), min(offset + p.numel(), end)
        if lo < hi and mark:
            if runs and runs[-1][1] == lo - start:
                runs[-1] = (runs[-1][0], hi - start)
            else:
                runs.append((lo - start, hi - start))
        offset += p.numel()
    return runs
