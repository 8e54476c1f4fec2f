"""A failing or stuck rank ends the job quickly, says which rank and operation, and keeps the traces."""

import os
import time

import pytest

import workbench as wb
from workbench.trace.validate import validate_trace


def test_a_rank_that_raises_fails_the_launch_with_its_traceback(tmp_path):
    t = time.time()
    with pytest.raises(wb.RunFailed) as e:
        wb.launch(wb.RunConfig(dp=2, steps=6, fault="raise", fault_rank=1, fault_step=3, timeout_s=30),
                  out=str(tmp_path / "crash"), progress=False)
    assert time.time() - t < 60, "fail fast, not after the process-group timeout"
    assert e.value.rank == 1
    assert "injected fault on rank 1 at step 3" in str(e.value)
    assert "Traceback" in e.value.traceback
    run = e.value.run
    assert len(run.metrics) == 3, "the metrics of the steps that finished are kept"
    for r in (0, 1):
        path = os.path.join(run.path, f"trace_rank{r}.json")
        assert os.path.exists(path), f"rank {r}'s trace is kept"
    assert all(validate_trace(t) == [] for t in run.traces)
    assert os.path.exists(os.path.join(run.path, "trace.json"))


def test_a_stuck_rank_times_out_naming_the_operation(tmp_path):
    t = time.time()
    with pytest.raises(wb.RunFailed) as e:
        wb.launch(wb.RunConfig(dp=2, steps=4, fault="hang", fault_rank=1, fault_step=1, timeout_s=5),
                  out=str(tmp_path / "hang"), progress=False)
    assert time.time() - t < 60
    msg = str(e.value)
    assert e.value.rank == 0 and "all_reduce" in msg and "group dp" in msg
    assert len(e.value.run.metrics) == 1
