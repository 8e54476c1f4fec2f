"""Mixed precision: bf16 and fp16 train; model states are measured at Megatron's 18Ψ with fp32 main
gradients (the default) and the ZeRO paper's 16Ψ with 16-bit gradients, whose fp32 copies at the update
are counted; fp16's dynamic loss scale skips an overflowing step, lowers the scale and recovers."""

import pytest

from workbench import ConfigError, RunConfig
from workbench.trace.validate import validate_run


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_runs_train_with_fp32_main_gradients(launched, precision):
    run = launched(dp=2, precision=precision, steps=20)
    m = run.metrics
    assert m.loss.iloc[-1] < m.loss.iloc[0] - 0.4, "the loss falls"
    assert validate_run(run.path) == []
    psi = run.config["params"]
    for r in run.summary["ranks"]:
        peak = r["peak_bytes"]
        assert peak["parameter"] == 2 * psi and peak["gradient"] == 4 * psi, (
            "16-bit weights, fp32 main_grad"
        )
        assert peak["optimizer_state"] == 12 * psi, "fp32 master weights + Adam's two moments"
        assert peak["temporary"] == 0, (
            "the main gradients are the masters' gradients: no copy at the update"
        )
        assert peak["activation"] == r["predicted_bytes"]["activation"]
        assert r["comm_bytes_per_step"]["all_reduce"]["dp"] == 4 + 4 * psi, (
            "the all-reduce moves fp32"
        )


def test_16_bit_gradient_reduction_halves_the_wire_and_pays_at_the_update(launched):
    """grad_reduce_dtype='bf16': 2Ψ of gradients and 2 bytes per value on the wire, but the update makes
    fp32 copies of every gradient (4Ψ, counted as temporary). They live after backward, when the
    activations are gone, so the total peak is 16Ψ + max(activations, 4Ψ) against 18Ψ + activations:
    on `tiny` activations dominate and 16-bit reduction saves its 2Ψ."""
    low = launched(dp=2, precision="bf16", grad_reduce_dtype="bf16", steps=20)
    main = launched(dp=2, precision="bf16", steps=20)
    psi = low.config["params"]
    for r in low.summary["ranks"]:
        assert r["peak_bytes"]["gradient"] == 2 * psi and r["peak_bytes"]["temporary"] == 4 * psi
        assert r["predicted_bytes"]["temporary"] == 4 * psi
        assert r["comm_bytes_per_step"]["all_reduce"]["dp"] == 4 + 2 * psi
    r_low, r_main = low.summary["ranks"][0], main.summary["ranks"][0]
    assert r_low["peak_bytes"]["activation"] > 4 * psi
    assert r_main["peak_total_bytes"] - r_low["peak_total_bytes"] == 2 * psi
    assert (low.metrics.loss - main.metrics.loss).abs().max() < 0.01, "both train the same model"


def test_bf16_stays_close_to_fp32(launched):
    """bf16 keeps 8 bits of mantissa: the loss drifts from fp32's by ~1e-2 over a few steps, not more."""
    fp32, bf16 = launched(dp=2).metrics.loss, launched(dp=2, precision="bf16").metrics.loss
    assert (fp32 - bf16).abs().max() < 0.05


@pytest.mark.slow  # notebook 06 checks the skipped step and draws the scale halving and recovering
def test_fp16_overflow_skips_that_step_halves_the_scale_and_recovers(launched):
    run = launched(
        dp=2,
        precision="fp16",
        fault="overflow",
        fault_rank=1,
        fault_step=2,
        loss_scale_growth_interval=2,
        steps=7,
    )
    m = run.metrics
    assert list(m.skipped) == [False, False, True, False, False, False, False]
    scales = list(m.loss_scale)
    assert scales[:5] == [65536.0, 131072.0, 65536.0, 65536.0, 131072.0], (
        "grow after 2 good steps, halve on overflow"
    )
    assert m.grad_norm.isna().tolist() == [False, False, True, False, False, False, False]
    assert m.loss.iloc[-1] < m.loss.iloc[3], "and training goes on"
    opt = [e["args"] for e in run.traces[0]["traceEvents"] if e.get("name") == "optimizer"]
    assert [a["skipped"] for a in opt] == list(m.skipped) and [
        a["loss_scale"] for a in opt
    ] == scales


def test_zero_with_16_bit_is_rejected_before_launch():
    with pytest.raises(ConfigError, match="precision='bf16' is not supported yet"):
        RunConfig(dp=2, zero=1, precision="bf16").validate()


def test_grad_reduce_dtype_must_be_fp32_or_the_parameters_own():
    with pytest.raises(ConfigError, match="grad_reduce_dtype='bf16' with precision='fp16'"):
        RunConfig(dp=2, precision="fp16", grad_reduce_dtype="bf16").validate()
    with pytest.raises(ConfigError, match="grad_reduce_dtype='bf16' with precision='fp32'"):
        RunConfig(dp=2, grad_reduce_dtype="bf16").validate()


class _OneRank:
    """The communicator of a run of one rank: the overflow flag needs no all-reduce."""

    def size(self, group):
        return 1


def _overflow_check_ops(layers: int, poison: bool) -> tuple[int, int, bool]:
    """(aten ops, host reads, overflow found) of one fp16 overflow check on a model of `layers` layers."""
    from collections import Counter

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from workbench.config import ModelConfig
    from workbench.model.gpt import GPT
    from workbench.optim.adamw import AdamHyper
    from workbench.optim.mixed_precision import MixedPrecisionUpdater

    model = GPT(ModelConfig(vocab_size=64, seq_len=8, hidden=16, heads=2, layers=layers)).half()
    for p in model.parameters():
        p.grad = torch.full_like(p, 1000.0)  # finite, but the norm of each is past fp16's 65504
    if poison:
        next(iter(model.parameters())).grad[0, 0] = float("inf")
    updater = MixedPrecisionUpdater(
        list(model.parameters()), _OneRank(), precision="fp16", lr=1e-3, hyper=AdamHyper()
    )
    ops: Counter = Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        found = updater.found_overflow()
    reads = ops.pop("aten._local_scalar_dense", 0)  # .item(): the host waits for the device
    return sum(ops.values()), reads, found


def test_fp16_checks_overflow_once_a_step_whatever_the_number_of_parameters():
    """One multi-tensor norm over every gradient and one read — not a check per tensor (about 330 ops a step on
    `small` before). The norm is taken in fp32: fp16's own norm of these finite gradients would be inf."""
    small, reads, found = _overflow_check_ops(2, poison=False)
    large, _, _ = _overflow_check_ops(8, poison=False)
    assert (small, reads, found) == (large, 1, False), (small, large, reads)
    assert small <= 12, small  # the norm, a stack, a sum, isfinite (four ops in aten), the flag
    assert _overflow_check_ops(2, poison=True)[2], "an inf in one gradient is found"
