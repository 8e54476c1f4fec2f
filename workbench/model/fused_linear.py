"""A linear layer whose output is several projections side by side: attention's q | k | v, SwiGLU's gate | up.

`sections` are their widths, in order. A dense model computes them as one matmul; tensor parallelism
(parallel/tensor_parallel.py) cuts each section t ways, so that every rank holds its heads of q, k and v, or its
columns of both gate and up — cutting the fused weight as one block would give one rank all of q and another all of v.
"""

from __future__ import annotations

from torch import nn


class FusedLinear(nn.Linear):
    """`nn.Linear(in_features, sum(sections))`, its outputs the `sections` one after another."""

    sections: tuple[int, ...]

    def __init__(self, in_features: int, sections: tuple[int, ...], *, bias: bool = True) -> None:
        super().__init__(in_features, sum(sections), bias=bias)
        self.sections = sections
