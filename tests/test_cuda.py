"""The CUDA / NCCL path. These tests run wherever a GPU is present (scripts/gpu_check.sh runs them on
a GPU machine); on a machine without CUDA there is no NCCL to test, and they are skipped."""

import pytest
import torch

from workbench.trace.validate import validate_run

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
needs_2_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than 2 CUDA devices")


@needs_gpu
def test_nccl_single_gpu_run_records_the_allocator(launched):
    run = launched(dp=1, backend="nccl")
    assert run.config["device"] == "cuda" and run.config["backend"] == "nccl"
    assert validate_run(run.path) == []
    r = run.summary["ranks"][0]
    states = sum(r["peak_bytes"][k] for k in ("parameter", "gradient", "optimizer_state"))
    # the allocator holds at least the model states we count (plus activations, workspace, the CUDA context's share)
    assert r["allocator_peak_bytes"]["allocated"] >= states
    assert r["peak_bytes"]["activation"] == r["predicted_bytes"]["activation"]


@needs_2_gpus
def test_nccl_data_parallel_matches_one_gpu(launched):
    from tests.test_data_parallel import assert_same_training

    assert_same_training(launched(dp=2, backend="nccl", bucket_mb=0.03), launched(dp=1, backend="nccl"))
    assert_same_training(launched(dp=2, backend="nccl", allreduce="ring", bucket_mb=0.03),
                         launched(dp=1, backend="nccl"))


@needs_gpu
def test_nccl_communication_is_timed_on_the_device(launched):
    """On NCCL a collective returns once queued: its record must come from the device (comm/device_timing.py),
    so it is written at the step's end, after its launch, with a positive duration, and no record is lost
    against the same run on gloo."""
    run = launched(dp=1, backend="nccl", steps=4)
    ev = run.events
    comm = ev[(ev.lane == "comm") & ev.op.notna() & ~ev.name.str.startswith("launch")]
    assert len(comm) > 0 and (comm.dur_us >= 0).all()
    gloo = launched(dp=1, backend="gloo", steps=4).events
    gloo_comm = gloo[(gloo.lane == "comm") & gloo.op.notna() & ~gloo.name.str.startswith("launch")]
    assert sorted(comm.name) == sorted(gloo_comm.name)
