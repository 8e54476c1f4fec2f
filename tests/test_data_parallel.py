"""Data parallelism trains the same model as one process (the correctness oracle).

Tolerance: |Δloss| ≤ 1e-5 · loss and |Δgrad_norm| ≤ 1e-4 · grad_norm at every step. Why: with the
same seed, weights and global batch, the only difference between dp=N and one process is the order
in which the gradient is summed (N partial means, reduced by the backend or our ring, instead of
one mean over the whole batch). fp32 addition is not associative, so the gradients differ in their
last bits (≈1e-7 relative); Adam divides by √v, so these differences stay at that level over a few
steps — measured here: at most 1 ulp of the loss (≈5e-7 absolute, 1.2e-7 relative) over 10 steps.
The bound leaves ~80× margin yet is far below what a real mistake causes: a rank that skipped the
all-reduce trains on half the batch and moves the loss by ~1e-3 after one step, and a missing
division by N doubles grad_norm (which is why grad_norm is compared too: Adam's update is nearly
invariant to the gradient's scale, the norm is not).
"""

import pytest

from workbench import RunConfig

LOSS_RTOL = 1e-5
NORM_RTOL = 1e-4


def assert_same_training(run, baseline, loss_rtol=LOSS_RTOL, norm_rtol=NORM_RTOL):
    a, b = run.metrics, baseline.metrics
    assert len(a) == len(b) > 0
    for step, (la, lb, na, nb) in enumerate(
        zip(a.loss, b.loss, a.grad_norm, b.grad_norm, strict=True)
    ):
        assert abs(la - lb) <= loss_rtol * abs(lb), f"step {step}: loss {la} vs single process {lb}"
        assert abs(na - nb) <= norm_rtol * abs(nb), (
            f"step {step}: grad_norm {na} vs single process {nb}"
        )


@pytest.fixture(scope="module")
def single(launched):
    return launched(dp=1)


@pytest.mark.parametrize(
    "config",
    [
        {"dp": 2},
        # notebook 01 holds dp4 to one process in make test
        pytest.param({"dp": 4}, marks=pytest.mark.slow),
        {"dp": 2, "allreduce": "ring", "bucket_mb": 0.03},
        # the run tests/test_traces.py validates: the comparison costs nothing
        {
            "dp": 2,
            "dp_impl": "naive",
        },
        {"dp": 2, "bucket_mb": 0.01},  # the run tests/test_traces.py validates
        # notebook 09 runs it
        pytest.param(
            {
                "dp": 4,
                "allreduce": "hierarchical",
                "ranks_per_node": 2,
                "bucket_mb": 0.03,
                "emulate_link": "inter=0.001,50;intra=2,5",
            },
            marks=pytest.mark.slow,
        ),
    ],
    ids=["dp2", "dp4", "dp2-ring", "dp2-naive", "dp2-small-buckets", "dp4-hierarchical-emulated"],
)
def test_data_parallel_matches_single_process(launched, single, config):
    assert_same_training(launched(**config), single)


@pytest.mark.slow  # make test: tests/test_data_source.py asserts the loss falls by 0.5 on text (dp 1 and 2)
def test_the_loss_falls(launched):
    m = launched(dp=2, steps=30).metrics
    assert m.loss.iloc[-1] < m.loss.iloc[0] - 0.5


def test_the_oracle_can_fail(launched, single):
    """A different global batch (another seed) is caught: the comparison is not vacuous."""
    with pytest.raises(AssertionError):
        assert_same_training(launched(dp=2, seed=1), single)


def test_buckets_follow_backward_order_and_size():
    from workbench.config.buckets import plan_buckets

    assert plan_buckets([10, 10, 10], 4, 80 / 2**20) == [[0, 1], [2]]
    assert plan_buckets([100, 1], 4, 1 / 2**20) == [[0], [1]]  # a big tensor gets its own bucket
    assert RunConfig(bucket_mb=0.5).bucket_mb == 0.5


@pytest.mark.slow  # notebook 08 runs `workbench run` (elastic) and holds its losses to the API run in make test
def test_the_cli_runs_match_too(tmp_path):
    """`workbench run --dp 2 --allreduce ring` against `workbench run --dp 1`, through the command line."""
    import subprocess
    import sys

    import workbench as wb

    common = [
        "--steps",
        "4",
        "--model",
        "tiny",
        "--global-batch",
        "16",
        "--seed",
        "0",
        "--quiet",
        "--timeout",
        "30",
    ]
    for name, extra in (
        ("one", ["--dp", "1"]),
        ("ring", ["--dp", "2", "--allreduce", "ring", "--bucket-mb", "0.05"]),
    ):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "workbench.cli",
                "run",
                *extra,
                *common,
                "--out",
                str(tmp_path / name),
            ],
            check=True,
            capture_output=True,
        )
    assert_same_training(wb.load(str(tmp_path / "ring")), wb.load(str(tmp_path / "one")))
