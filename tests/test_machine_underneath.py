"""The helpers of notebook 12 (issue 40): the crossover formulas, FP8 emulation, and the roofline's counts."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.config import ModelConfig
from workbench.measure import roofline
from workbench.model.fp8_emulated import (
    E4M3,
    E5M2,
    AmaxHistory,
    emulate_fp8,
    formats,
    fp8_linear,
    quantize,
)
from workbench.predict.formulas import crossover


def test_each_ratio_is_one_at_its_crossover():
    F, BW = 300e12, 50e9
    assert crossover.dp_ratio(crossover.dp_crossover(F, BW), F, BW) == pytest.approx(1.0)
    assert crossover.zero3_ratio(
        crossover.zero3_crossover(F, BW, n=4), F, BW, n=4
    ) == pytest.approx(1.0)
    assert crossover.tp_ratio(crossover.tp_crossover(8, F, BW), 8, F, BW) == pytest.approx(1.0)
    t = crossover.pp_crossover(4096, 4, F, BW, alpha=10e-6)
    assert crossover.pp_ratio(t, 4096, 4, F, BW, alpha=10e-6) == pytest.approx(1.0)
    # ZeRO-3 moves 1.5 × DP's bytes, so it turns communication-bound at 1.5 × the tokens
    assert crossover.zero3_crossover(F, BW) == pytest.approx(1.5 * crossover.dp_crossover(F, BW))
    # tensor parallelism's ratio does not depend on the batch, and halves when h doubles
    assert crossover.tp_ratio(2048, 8, F, BW) == pytest.approx(
        2 * crossover.tp_ratio(4096, 8, F, BW)
    )
    # transfers outlast compute at any size
    assert math.isinf(crossover.pp_crossover(64, 1, 1e15, 1e6, alpha=1e-3))


def test_the_roofline_bends_at_the_ridge():
    assert crossover.attainable(1.0, 100.0, 10.0) == 10.0
    assert crossover.attainable(100.0, 100.0, 10.0) == 100.0
    assert crossover.ridge(100.0, 10.0) == 10.0


def test_fp8_quantization_and_its_scalings():
    torch.manual_seed(0)
    x = torch.randn(4096) * 1e-3  # a gradient's magnitude
    unscaled = quantize(x, E4M3, "none")
    assert (unscaled == 0).float().mean() > 0.3  # most of it under E4M3's smallest normal (2⁻⁶)
    for scaling in ("per-tensor", "per-block"):
        q = quantize(x, E4M3, scaling)
        assert (q - x).norm() / x.norm() < 0.05 and (q == 0).sum() == 0
    history = AmaxHistory(4)
    assert history.scale_amax(x) == pytest.approx(float(x.abs().max()))  # first: its own
    assert history.scale_amax(x / 2) == pytest.approx(float(x.abs().max()))  # then the history's
    per_block = quantize(x, E4M3, "per-block").reshape(-1, 32)
    assert torch.equal(quantize(x[:32], E4M3, "per-block"), per_block[0])  # each block on its own
    assert [f["format"] for f in formats()] == ["bf16", "fp16", "fp8 E4M3", "fp8 E5M2"]
    assert formats()[2]["max"] == 448 and formats()[3]["max"] == 57344


def test_an_fp8_linear_passes_gradients_straight_through():
    """Forward: the product of the quantised operands; backward: gradients from the quantised operands and
    the E5M2 output gradient — close to the fp32 ones, exactly what an FP8 GEMM computes."""
    torch.manual_seed(0)
    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(4, 16, requires_grad=True)
    y = fp8_linear(x, w, None)
    assert torch.allclose(y, quantize(x, E4M3) @ quantize(w, E4M3).t())
    y.sum().backward()
    g = quantize(torch.ones(8, 4), E5M2)
    assert torch.allclose(x.grad, g @ quantize(w, E4M3)) and torch.allclose(
        w.grad, g.t() @ quantize(x, E4M3)
    )
    model = emulate_fp8(torch.nn.Sequential(torch.nn.Linear(16, 4)))
    assert torch.allclose(model(x.detach()), fp8_linear(x.detach(), model[0].weight, model[0].bias))


def test_the_step_ops_are_counted_from_their_shapes():
    cfg = ModelConfig(vocab_size=64, seq_len=16, hidden=32, heads=4, layers=2)
    ops = {op["op"]: op for op in roofline.step_ops(cfg, micro=2, repeats=1)}
    T, h = 2 * 16, 32
    assert ops["qkv matmul"]["flops"] == 2 * T * h * 3 * h and ops["qkv matmul"]["count"] == 2
    assert ops["MLP down matmul"]["bytes"] == (T * 4 * h + 4 * h * h + T * h) * 4
    assert ops["AdamW"]["flops"] == 12 * cfg.param_count()
    assert all(
        op["seconds"] > 0 and op["intensity"] == op["flops"] / op["bytes"] for op in ops.values()
    )
    assert ops["GELU"]["intensity"] < ops["MLP up matmul"]["intensity"]
    sweep = roofline.matmul_sweep([(32, 32, 32)], repeats=1)
    assert sweep[0]["flops_per_s"] == pytest.approx(2 * 32**3 / sweep[0]["seconds"])
    bw = roofline.stream(values=100_000)
    assert bw["copy"] > 0 and bw["triad"] > 0
