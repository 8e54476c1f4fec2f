"""FP8 training, emulated: the numerics of 8-bit matmuls on any device, not their speed (notebook 12).

An FP8 recipe (Micikevicius et al. 2022, "FP8 formats for deep learning"; NVIDIA Transformer Engine) keeps
the weights and the optimizer in higher precision and runs each Linear's matmul on 8-bit operands: the
input and the weight in E4M3 (more precision, max 448), the output's gradient in E5M2 (more range, max
57,344). 8 bits hold so little range that every tensor is first **scaled** into the format's:

    per-tensor   s = max|x| / fmax, from this very tensor (one amax reduction before the cast)
    delayed      s from the largest amax of the last `history` steps (Transformer Engine's default: the
                 cast needs no reduction first; an outlier that grows faster than the history is clipped)
    per-block    s for each block of 32 consecutive values, a power of two (the OCP MX formats' E8M0
                 scale; DeepSeek-V3 scales 1×128 tiles): an outlier costs only its own block's precision

`quantize` casts to the format and back (`fp8_cast`): the values an FP8 matmul would multiply, in the
original dtype. `emulate_fp8(model)` makes every Linear do so around its matmul, forward and backward —
labelled *emulated* wherever it shows: it runs at the original dtype's speed. On a GPU with FP8 tensor
cores, torch._scaled_mm runs the same products in 8 bits (notebook 12's GPU cell).
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Any

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
BLOCK = 32  # the OCP MX formats' block


def fp8_cast(x: torch.Tensor, fmt: torch.dtype) -> torch.Tensor:
    """x rounded to the nearest value of `fmt` (saturating at its max), back in x's dtype."""
    fmax = torch.finfo(fmt).max
    return x.clamp(-fmax, fmax).to(fmt).to(x.dtype)


def quantize(
    x: torch.Tensor, fmt: torch.dtype = E4M3, scaling: str = "per-tensor", amax: float | None = None
) -> torch.Tensor:
    """x as an FP8 matmul would see it: scaled into `fmt`'s range, cast, scaled back. `scaling`: 'per-tensor'
    (this tensor's amax), 'delayed' (the `amax` given: a history's), 'per-block' (a power-of-two scale per
    block of 32 values), or 'none' (cast as is: what goes wrong without scaling)."""
    fmax = torch.finfo(fmt).max
    if scaling == "none":
        return fp8_cast(x, fmt)
    if scaling == "per-block":
        flat = x.reshape(-1)
        pad = (-flat.numel()) % BLOCK
        blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, BLOCK)
        block_max = (
            blocks.detach().abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
        )
        scale = torch.exp2(torch.floor(torch.log2(fmax / block_max)))  # E8M0: a power of two
        out = fp8_cast(blocks * scale, fmt) / scale
        return out.reshape(-1)[: flat.numel()].reshape(x.shape)
    top = float(x.detach().abs().max()) if scaling == "per-tensor" else float(amax or 0.0)
    factor = fmax / top if top > 0 else 1.0
    return fp8_cast(x * factor, fmt) / factor


class _Fp8Matmul(torch.autograd.Function):
    """y = Q(x)·Q(W)ᵀ; backward: the output's gradient in E5M2, the input's and the weight's gradients from
    the quantized operands (as an FP8 GEMM computes them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, scaling: str) -> torch.Tensor:
        qx, qw = quantize(x, E4M3, scaling), quantize(weight, E4M3, scaling)
        ctx.save_for_backward(qx, qw)
        ctx.scaling = scaling
        return qx @ qw.t()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        qx, qw = ctx.saved_tensors
        qg = quantize(grad, E5M2, ctx.scaling)
        return qg @ qw, qg.reshape(-1, qg.shape[-1]).t() @ qx.reshape(-1, qx.shape[-1]), None


def fp8_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scaling: str = "per-tensor"
) -> torch.Tensor:
    y = _Fp8Matmul.apply(x, weight, scaling)
    return y + bias if bias is not None else y


def _fp8_forward(m: nn.Linear, scaling: str, x: torch.Tensor) -> torch.Tensor:
    return fp8_linear(x, m.weight, m.bias, scaling)


def emulate_fp8(model: nn.Module, scaling: str = "per-tensor") -> nn.Module:
    """Every nn.Linear of `model` runs its matmul FP8-emulated (in place; returns the model)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            # on purpose: this instance's forward shadows nn.Linear's (Module.__call__ finds it first),
            # an assignment mypy refuses on a method
            module.forward = partial(_fp8_forward, module, scaling)  # type: ignore[method-assign]
    return model


class AmaxHistory:
    """Delayed scaling's amax history: the largest |x| of the last `length` tensors seen."""

    def __init__(self, length: int = 16) -> None:
        self.values: deque[float] = deque(maxlen=length)

    def scale_amax(self, x: torch.Tensor) -> float:
        """The amax to scale x by (the history's, before x's own joins it; x's own the first time)."""
        current = float(x.detach().abs().max())
        amax = max(self.values) if self.values else current
        self.values.append(current)
        return amax


def formats() -> list[dict[str, Any]]:
    """bf16, fp16, E4M3 and E5M2 side by side: bits of exponent and mantissa, largest value, smallest normal,
    and the relative step between neighbours (eps)."""
    rows = []
    for name, dtype, e, m in (
        ("bf16", torch.bfloat16, 8, 7),
        ("fp16", torch.float16, 5, 10),
        ("fp8 E4M3", E4M3, 4, 3),
        ("fp8 E5M2", E5M2, 5, 2),
    ):
        fi = torch.finfo(dtype)
        rows.append(
            {
                "format": name,
                "exponent bits": e,
                "mantissa bits": m,
                "max": float(fi.max),
                "smallest normal": float(fi.smallest_normal),
                "eps": float(fi.eps),
            }
        )
    return rows
