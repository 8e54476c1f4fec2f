"""The parts a Llama-style block (Touvron et al. 2023; Llama 3, Dubey et al. 2024) puts in place of GPT-2's:
RMSNorm for LayerNorm, SwiGLU for the GELU MLP, rotary positions (RoPE) for the learned position table.
Grouped-query attention is model/gpt.py's attention with fewer K/V heads.

    RMSNorm     y = x / √(mean(x²) + ε) · g          (Zhang and Sennrich 2019): no mean, no bias
    SwiGLU      y = down(silu(gate(x)) ⊙ up(x))      (Shazeer 2020): three matrices of the inner width f;
                gate and up are one fused projection of 2f outputs, as Megatron-LM fuses them, so tensor
                parallelism splits each half (column-parallel) and `down` is row-parallel
    RoPE        each pair (x₂ᵢ, x₂ᵢ₊₁) of a query's and a key's head — here the halves (xᵢ, xᵢ₊d/2), as
                GPT-NeoX and Hugging Face's Llama pair them — rotated by the angle p·θ^(−2i/d) of the token's
                position p (Su et al. 2021): q·k then depends on positions only through their difference.

What each saves for backward (the activation formula counts exactly these, predict/formulas/activations.py):
RMSNorm its input and 1/rms (fp32, one value a token, on every device: `RMSNormFunction` below, not torch's
decomposition, which also saves the normalised input); SwiGLU the fused gate-and-up output, silu's output
and the product; RoPE nothing but its cos and sin tables (buffers: not activations).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.model.fused_linear import FusedLinear


class RMSNormFunction(torch.autograd.Function):
    """y = x · r · g with r = 1/√(mean(x²) + ε), computed in fp32 (at least); saves x and r only.

    Backward, with n = x·r and ĝ = dy·g: dx = r·(ĝ − n·mean(ĝ·n)), dg = Σ dy·n (over every token)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(wide(x))
        r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, r)
        return (x32 * r).to(x.dtype) * weight

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, r = ctx.saved_tensors
        n = x.to(r.dtype) * r
        g = dy.to(r.dtype) * weight.to(r.dtype)
        dx = r * (g - n * (g * n).mean(-1, keepdim=True))
        dw = (
            (dy.to(r.dtype) * n).reshape(-1, n.size(-1)).sum(0) if ctx.needs_input_grad[1] else None
        )
        return dx.to(x.dtype), None if dw is None else dw.to(weight.dtype), None


def wide(x: torch.Tensor) -> torch.dtype:
    """fp32 for 16-bit inputs, the input's own type otherwise (fp64 stays fp64: gradcheck)."""
    return torch.promote_types(x.dtype, torch.float32)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a gain `weight` (initialised to ones: its name is `ln_*`)."""

    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return RMSNormFunction.apply(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) ⊙ up(x)); `fc` is gate and up fused (2f outputs), `proj` is down. The names are
    the GELU MLP's, so tensor parallelism's plan and the zero-bubble weight split find them the same way."""

    def __init__(self, hidden: int, inner: int, bias: bool = False) -> None:
        super().__init__()
        # gate, up: tensor parallelism splits each (parallel/tensor_parallel.py)
        self.fc = FusedLinear(hidden, (inner, inner), bias=bias)
        self.proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(swiglu(self.fc(x)))


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) ⊙ up of a (..., 2f) tensor holding gate then up (each tp rank: its halves of both)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (tokens, head_dim), of the angles p·θ^(−2i/d) for every token position p, the halves
    repeated (the rotation pairs dimension i with i + d/2). Built on the CPU in fp64 and rounded to fp32, so
    every device and every strategy rotates by the same numbers."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim)
    angles = positions.to("cpu", torch.float64).unsqueeze(-1) * inv
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin for x (b, heads, s, d) and tables (s, d): each pair rotated by its angle."""
    half = x.size(-1) // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.to(x.dtype) + turned * sin.to(x.dtype)
