"""Mixed precision: bf16 and fp16 train, the 16Ψ of model states is measured, and fp16's dynamic loss
scale skips an overflowing step, lowers the scale and recovers."""

import pytest

from workbench import ConfigError, RunConfig
from workbench.trace.validate import validate_run


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_runs_train_and_hold_16_psi_of_model_states(launched, precision):
    run = launched(dp=2, precision=precision, steps=20)
    m = run.metrics
    assert m.loss.iloc[-1] < m.loss.iloc[0] - 0.4, "the loss falls"
    assert validate_run(run.path) == []
    psi = run.config["params"]
    for r in run.summary["ranks"]:
        peak = r["peak_bytes"]
        assert peak["parameter"] == 2 * psi and peak["gradient"] == 2 * psi
        assert peak["optimizer_state"] == 12 * psi, "fp32 master weights + Adam's two moments"
        assert peak["activation"] == r["predicted_bytes"]["activation"]


def test_bf16_stays_close_to_fp32(launched):
    """bf16 keeps 8 bits of mantissa: the loss drifts from fp32's by ~1e-2 over a few steps, not more."""
    fp32, bf16 = launched(dp=2).metrics.loss, launched(dp=2, precision="bf16").metrics.loss
    assert (fp32 - bf16).abs().max() < 0.05


def test_fp16_overflow_skips_that_step_halves_the_scale_and_recovers(launched):
    run = launched(dp=2, precision="fp16", fault="overflow", fault_rank=1, fault_step=2,
                   loss_scale_growth_interval=2, steps=7)
    m = run.metrics
    assert list(m.skipped) == [False, False, True, False, False, False, False]
    scales = list(m.loss_scale)
    assert scales[:5] == [65536.0, 131072.0, 65536.0, 65536.0, 131072.0], "grow after 2 good steps, halve on overflow"
    assert m.grad_norm.isna().tolist() == [False, False, True, False, False, False, False]
    assert m.loss.iloc[-1] < m.loss.iloc[3], "and training goes on"
    opt = [e["args"] for e in run.traces[0]["traceEvents"] if e.get("name") == "optimizer"]
    assert [a["skipped"] for a in opt] == list(m.skipped) and [a["loss_scale"] for a in opt] == scales


def test_zero_with_16_bit_is_rejected_before_launch():
    with pytest.raises(ConfigError, match="precision='bf16' is not supported yet"):
        RunConfig(dp=2, zero=1, precision="bf16").validate()
