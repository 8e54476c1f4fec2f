"""The GPU acceptance suite, part two: checkpoints, restarts and hangs on NCCL (`make test-gpu`).

- resume: the state after step k is all a step depends on, and the same kernels on the same inputs give
  the same bits, so a resumed run's losses equal the uninterrupted run's exactly;
- a SIGKILLed rank: torchrun restarts the group, which resumes from the newest checkpoint and ends with
  the uninterrupted run's losses;
- a hung rank: its peer's NCCL collective never completes; `Work.wait()` returns at once on NCCL, so
  the rank's own wait carries the deadline (comm/device_timing.py) and ends in a CommError naming the
  operation — an error file per rank, torch's flight recorder dumps beside them, well before a
  30-minute default would have.
"""

import os
import time

import pytest

import workbench as wb
from tests.gpu.gpus import needs
from workbench.analysis.doctor import diagnose

pytestmark = pytest.mark.gpu

SMALL = {"model": "small", "global_batch": 16, "backend": "nccl"}


@needs(2)
@pytest.mark.parametrize(
    "config",
    [{"dp": 2}, {"dp": 2, "zero": 3}, {"dp": 2, "precision": "bf16"}],
    ids=["dp2", "zero3", "bf16"],
)
def test_resume_on_nccl_continues_bit_identically(launched, config):
    full = launched(steps=6, checkpoint_every=3, **SMALL, **config)
    resumed = launched(
        steps=6, resume=os.path.join(full.path, "checkpoints", "step_000003"), **SMALL, **config
    )
    tail = full.metrics[full.metrics.step >= 3].reset_index(drop=True)
    assert list(resumed.metrics.loss) == list(tail.loss)
    assert list(resumed.metrics.grad_norm) == list(tail.grad_norm)


@needs(2)
def test_a_killed_rank_is_restarted_on_nccl(launched):
    run = launched(
        dp=2,
        steps=6,
        checkpoint_every=2,
        max_restarts=1,
        fault="kill",
        fault_rank=1,
        fault_step=3,
        **SMALL,
    )
    whole = launched(dp=2, steps=6, **SMALL)
    assert list(run.metrics.step) == list(range(6))
    assert list(run.metrics.loss) == list(whole.metrics.loss)
    assert list(run.metrics.attempt) == [0, 0, 1, 1, 1, 1]


@needs(2)
def test_a_hang_on_nccl_ends_in_a_comm_error_with_error_files(tmp_path):
    t = time.time()
    with pytest.raises(wb.RunFailed) as e:
        wb.launch(
            wb.RunConfig(
                dp=2, steps=4, fault="hang", fault_rank=1, fault_step=1, timeout_s=20, **SMALL
            ),
            out=str(tmp_path / "hang"),
            progress=False,
        )
    assert time.time() - t < 150, "ended near the 20 s timeout, not after NCCL's default"
    assert e.value.rank == 0 and "CommError" in str(e.value) and "timed out" in str(e.value)
    path = e.value.run.path
    assert {"error_rank0.json", "error_rank1.json"} <= set(os.listdir(path))
    assert os.path.exists(os.path.join(path, "fr_trace_rank0")), "torch's flight recorder, dumped"
    assert "behind: rank 1" in diagnose(path)
