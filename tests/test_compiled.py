"""--compile: each transformer block compiled by torch.compile (inductor's CPU backend here), trained with
data parallelism beside an eager run of the same config: the same model within fp32 rounding, a valid
trace; what would put communication or tracing inside a block is refused before launch."""

import pytest

from workbench import ConfigError, RunConfig
from workbench.trace.validate import validate_run

#: inductor fuses element-wise chains and may order a reduction's sums differently (layer norm, softmax,
#: GELU): fp32 results that differ in the last bits, ~1e-7 of the loss; six steps of AdamW carry that to
#: ~1e-7–1e-6 relative (measured here: 1.2e-7). 1e-5 leaves an order of magnitude for other CPUs' vector
#: widths, and is far below what a wrong graph gives (a missing residual or scale moves the loss by > 1e-2).
RTOL = 1e-5


def test_compiled_blocks_train_the_eager_model(launched):
    eager, compiled = launched(dp=2, bucket_mb=0.01), launched(dp=2, bucket_mb=0.01, compile=True)
    a, b = compiled.metrics.loss, eager.metrics.loss
    assert ((a - b).abs() / b.abs()).max() < RTOL, list(zip(a, b, strict=True))
    assert validate_run(compiled.path) == []
    assert compiled.config["compile"] is True


@pytest.mark.parametrize(
    "change, named",
    [
        ({"tp": 2}, "tp=2"),
        ({"cp": 2}, "cp=2"),
        ({"zero": 3, "dp": 2}, "zero=3"),
        ({"recompute": "full"}, "recompute='full'"),
        ({"model": "tiny-moe"}, "model.experts=4"),
    ],
)
def test_what_would_communicate_inside_a_block_is_refused(change, named):
    with pytest.raises(ConfigError, match=rf"compile=True with {named}.*valid"):
        RunConfig(compile=True, **change).validate()
