"""1-bit Adam (optim/onebit_adam.py): AdamW during the warm-up, then the momentum all-reduced as
signs with error feedback — 1/32 of the bytes, and the loss still falls."""

import pytest
import torch

from tests.distributed import make_comm, run_ranks
from workbench import ConfigError, RunConfig
from workbench.optim.onebit_adam import pack_signs, unpack_signs
from workbench.trace.bandwidth import bytes_sent
from workbench.trace.spans import comm_intervals

STEPS, WARMUP = 30, 8


def test_signs_pack_eight_to_a_byte():
    x = torch.tensor([1.0, -2.0, 0.0, -0.5, 3.0, 3.0, -1.0, 2.0] * 3)
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == 3
    assert torch.equal(unpack_signs(packed), torch.where(x >= 0, 1.0, -1.0))


def _error_feedback(rank: int, world: int) -> None:
    from workbench.optim.onebit_adam import CompressedAllReduce

    comm = make_comm(rank, world, dp=world)
    inputs = [torch.randn(64, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    mean = sum(inputs) / world
    reduce = CompressedAllReduce(comm, 64, torch.device("cpu"))
    outs = [reduce(inputs[rank]) for _ in range(100)]
    one_shot = float((outs[0] - mean).norm() / mean.norm())
    averaged = float((sum(outs) / len(outs) - mean).norm() / mean.norm())
    assert one_shot > 0.3, "one message of signs is a poor copy of the mean"
    # what was dropped is sent later: nothing is lost for good
    assert averaged < 0.05, (
        one_shot,
        averaged,
    )


def test_error_feedback_makes_the_compressed_mean_exact_over_time():
    """The same inputs reduced 100 times: each result is signs × a scale (far from the mean), but the
    errors fed back make their average converge to the exact mean."""
    run_ranks(_error_feedback, 2)


@pytest.mark.slow  # notebook 09 checks the 1/32, the bit-exact warm-up and the loss in make test
def test_onebit_adam_sends_a_32nd_and_the_loss_still_falls(launched):
    adam = launched(dp=2, steps=STEPS)
    onebit = launched(dp=2, steps=STEPS, optimizer="onebit-adam", onebit_warmup_steps=WARMUP)
    assert list(onebit.metrics.loss[: WARMUP + 1]) == list(adam.metrics.loss[: WARMUP + 1]), (
        "the warm-up is AdamW on the all-reduced gradient: the same losses, bit for bit"
    )
    loss = list(onebit.metrics.loss)
    assert loss[-1] < loss[WARMUP] - 0.3, "the compressed stage still trains"
    # measured on this model (deterministic in fp32): 1-bit Adam ends 12 % above Adam after 22 compressed
    # steps (with the exact mean instead of signs, frozen-variance Adam ends 4 % below it)
    assert loss[-1] < 1.2 * adam.metrics.loss.iloc[-1]
    full, compressed = _gradient_bytes(onebit, WARMUP - 1), _gradient_bytes(onebit, WARMUP + 1)
    assert 1 / 32 <= compressed / full <= 1.1 / 32, (compressed, full)


def _gradient_bytes(run, step: int) -> float:
    """Bytes rank 0 sent for the gradients (buckets) or the momentum (signs and scales) in one step."""
    trace = next(t for t in run.traces if t["distributedInfo"]["rank"] == 0)
    ops = [a for a, _, _ in comm_intervals(trace["traceEvents"])]  # each operation once
    return sum(
        bytes_sent(a)
        for a in ops
        if a.get("step") == step
        and str(a.get("label", "")).startswith(("bucket", "onebit signs", "onebit scales"))
    )


def test_onebit_adam_says_what_it_needs():
    with pytest.raises(ConfigError, match="onebit_warmup_steps=0"):
        RunConfig(optimizer="onebit-adam", onebit_warmup_steps=0).validate()
    with pytest.raises(ConfigError, match="'zero': 1"):
        RunConfig(dp=2, optimizer="onebit-adam", zero=1).validate()
    with pytest.raises(ConfigError, match="valid optimizers"):
        RunConfig(optimizer="lamb").validate()
