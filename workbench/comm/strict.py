"""What NCCL demands of a tensor, checked on any backend: the strict mode.

gloo forgives what NCCL does not. NCCL reads and writes a tensor's memory as one dense block on the
rank's own GPU, in one of its data types; gloo copies whatever it is given. So a run that works on CPUs
can fail on its first GPU machine — or, worse, send the wrong bytes. In strict mode every tensor handed
to a collective or a point-to-point operation is checked before it is posted:

    device       on the rank's device (no CPU tensor reaches a CUDA group)
    layout       dense (torch.strided), not sparse
    contiguous   one block of memory, as NCCL reads it
    dtype        one NCCL has (float16, bfloat16, float32, float64, int8, uint8, int32, int64, bool as
                 uint8, the two float8 types)

A violation raises `StrictCommError` naming the call site outside the communication layer. Strict mode is
on wherever `WORKBENCH_STRICT_COMM=1` (the whole test suite: tests/conftest.py and the root conftest.py
set it, so every rank and every notebook's run checks); on a CUDA rank the device check always runs.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

import torch

ENV = "WORKBENCH_STRICT_COMM"

NCCL_DTYPES = frozenset(
    {
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
        torch.bool,
    }
    | {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
)


class StrictCommError(RuntimeError):
    """A tensor NCCL would refuse (or misread) was handed to a communication operation."""


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def problems(tensor: torch.Tensor, device: torch.device) -> list[str]:
    """What NCCL would object to in `tensor` on a rank whose device is `device` (empty: nothing)."""
    out = []
    if tensor.device != device:
        out.append(f"it is on {tensor.device}, the rank's device is {device}")
    if tensor.layout != torch.strided:
        out.append(f"its layout is {tensor.layout} (NCCL needs dense tensors)")
    elif not tensor.is_contiguous():
        out.append(
            f"it is not contiguous (shape {tuple(tensor.shape)}, strides {tensor.stride()}): "
            f"NCCL reads one block of memory"
        )
    if tensor.dtype not in NCCL_DTYPES:
        out.append(f"its dtype {tensor.dtype} is not one NCCL has")
    return out


def call_site() -> str:
    """The innermost frame outside workbench/comm/ (and torch): where the offending call was made."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(here) and f"{os.sep}torch{os.sep}" not in path:
            return f"{path}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def check(tensors: list[torch.Tensor], device: torch.device, op: str, strict: bool) -> None:
    """Raise StrictCommError for the first tensor NCCL would not take (device always on CUDA ranks; every
    rule in strict mode)."""
    if not strict and device.type != "cuda":
        return
    for i, t in enumerate(tensors):
        found = (
            problems(t, device)
            if strict
            else [p for p in problems(t, device) if p.startswith("it is on")]
        )
        if found:
            which = f"tensor {i} of {op}" if len(tensors) > 1 else f"the tensor of {op}"
            raise StrictCommError(f"{which} at {call_site()}: " + "; ".join(found))
