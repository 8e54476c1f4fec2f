"""The GPU acceptance suite, part three: what one GPU proves (`make test-gpu` on a single-GPU machine).

NCCL needs a GPU per rank, so a machine with one GPU runs one rank; what it can still prove:

- **one GPU trains what one CPU process trains**: the same model, seed and batch in fp32 on CUDA (NCCL
  backend) and on the CPU (gloo) give the same losses within 1e-5 relative and gradient norms within
  1e-4: every operation is the same fp32 arithmetic, summed in other orders by other kernels (TF32 stays
  off, torch's default for matmuls), so what differs is rounding, which six steps of Adam do not grow
  past that;
- **ZeRO-Offload on one GPU** (Ren et al., 2021: the optimizer's states and step on the host, the single-GPU
  case of the paper): the GPU holds no optimizer state, the host holds what the formula says, and the
  training equals the GPU's own (Adam's step on the CPU rounds as the GPU's does but for fused
  multiply-adds: the same 1e-5);
- **recomputation on CUDA**: the activation category equals the formula's CUDA case for each mode, and the
  losses equal the plain run's (recomputing runs the same kernels on the same inputs);
- **fp16 with dynamic loss scaling**: the loss falls, model states are 18Ψ;
- **resume**: bit-identical on one GPU;
- the allocator explained in every case (tests/gpu/test_strategies_on_nccl.py says how).
"""

import os

import pytest

from tests.gpu.gpus import needs
from tests.gpu.test_strategies_on_nccl import assert_allocator_explained
from tests.test_data_parallel import assert_same_training
from workbench.trace.validate import validate_run

pytestmark = pytest.mark.gpu

RTOL_LOSS, RTOL_NORM = 1e-5, 1e-4
ONE = {"model": "small", "global_batch": 16, "steps": 6}


@needs(1)
@pytest.mark.parametrize("model", ["small", "tiny-moe"])
def test_one_gpu_trains_what_one_cpu_process_trains(launched, model):
    gpu = launched(backend="nccl", **{**ONE, "model": model})
    cpu = launched(backend="gloo", **{**ONE, "model": model})
    assert gpu.config["device"] == "cuda" and cpu.config["device"] == "cpu"
    assert_same_training(gpu, cpu, RTOL_LOSS, RTOL_NORM)
    assert validate_run(gpu.path) == []
    assert_allocator_explained(gpu.summary["ranks"][0])
    if model == "tiny-moe":
        assert list(gpu.metrics.tokens_per_expert) == list(cpu.metrics.tokens_per_expert), (
            "the same routing"
        )


@needs(1)
@pytest.mark.parametrize("zero", [1, 3])
def test_zero_offload_on_one_gpu(launched, zero):
    run = launched(backend="nccl", zero=zero, offload_optimizer=True, **ONE)
    assert_same_training(run, launched(backend="nccl", **ONE), RTOL_LOSS, RTOL_NORM)
    r = run.summary["ranks"][0]
    assert r["peak_bytes"]["optimizer_state"] == 0, "the GPU holds no optimizer state"
    assert r["host_peak_bytes"] == pytest.approx(r["predicted_host_bytes"], rel=0.03)
    assert_allocator_explained(r)


@needs(1)
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_on_one_gpu(launched, recompute):
    run = launched(backend="nccl", recompute=recompute, **ONE)
    assert_same_training(run, launched(backend="nccl", **ONE), RTOL_LOSS, RTOL_NORM)
    r = run.summary["ranks"][0]
    assert r["peak_bytes"]["activation"] == r["predicted_bytes"]["activation"], recompute
    assert_allocator_explained(r)


@needs(1)
def test_fp16_with_loss_scaling_on_one_gpu(launched):
    run = launched(backend="nccl", **{**ONE, "precision": "fp16", "steps": 12})
    assert run.metrics.loss.iloc[-1] < run.metrics.loss.iloc[0]
    r = run.summary["ranks"][0]
    assert (
        sum(r["peak_bytes"][k] for k in ("parameter", "gradient", "optimizer_state"))
        == 18 * run.config["params"]
    )
    assert_allocator_explained(r)
    assert validate_run(run.path) == []


@needs(1)
def test_resume_on_one_gpu_is_bit_identical(launched):
    full = launched(backend="nccl", checkpoint_every=3, **ONE)
    resumed = launched(
        backend="nccl", resume=os.path.join(full.path, "checkpoints", "step_000003"), **ONE
    )
    tail = full.metrics[full.metrics.step >= 3].reset_index(drop=True)
    assert list(resumed.metrics.loss) == list(tail.loss)
    assert list(resumed.metrics.grad_norm) == list(tail.grad_norm)


@needs(1)
def test_the_gpu_reports_its_health_through_nvml(launched):
    """Each step a CUDA rank reads its GPU through NVML (measure/gpu_health.py): rank 0's figures in
    metrics.jsonl, every sample in gpu_health.jsonl, doctor's summary of them."""
    pytest.importorskip("pynvml", reason="nvidia-ml-py (NVML's bindings) is not installed here")
    from workbench.analysis.doctor import diagnose

    run = launched(backend="nccl", **ONE)
    for gpu in run.metrics.gpu:
        assert 0 < gpu["temperature_c"] < 120 and gpu["power_w"] > 0 and gpu["sm_clock_mhz"] > 0, (
            gpu
        )
    with open(os.path.join(run.path, "gpu_health.jsonl")) as f:
        assert len(f.readlines()) == ONE["steps"]
    assert "GPU health (NVML" in diagnose(run.path)
