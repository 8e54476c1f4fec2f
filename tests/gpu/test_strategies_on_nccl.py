"""The GPU acceptance suite (`make test-gpu`): every strategy on NCCL, on as many GPUs as the machine has.

Each case needs some number of GPUs (one rank per GPU) and is skipped on a machine with fewer; on a
machine without CUDA every case is skipped and the suite passes. Each asserts what the CPU suite asserts
on gloo, where it applies:

- **the oracle**: the same losses and gradient norms as one process on one GPU, same model, seed and
  global batch, in fp32 — within 2e-6 relative on the loss and 1e-4 on the gradient norm: a data-parallel
  rank multiplies half the rows, and cuBLAS picks other kernels (other summation orders) for other
  shapes; TF32 is off (torch's default for matmuls), so what differs is rounding, not precision;
- the trace is valid (`validate_run`);
- bytes per step equal the formula, each operation counted once (device records only: the host's launch
  spans are not operations);
- the allocator is explained: at every snapshot the categories account for the allocator's live bytes
  but for a workspace allowance (cuBLAS keeps up to 32 MiB per stream; 64 MiB + 10 % are allowed), and
  never for more than it holds;
- a pipeline's `wait` lane is not empty: on NCCL a rank that waits for its input blocks (device-true
  waits, comm/device_timing.py), so its bubble is measured, not booked as compute.

Pipelines run a gpt2-small-shaped model (hidden 768, sequence 1024) cut to 4 layers: a microbatch of 2
sends 2 · 1024 · 768 · 4 B = 6.3 MB between stages, above NCCL's 4 MB eager buffer, where a send
waits for its receive — the case the schedule validator's NCCL rule is about.
"""

import pytest

from tests.gpu.gpus import needs
from tests.test_data_parallel import assert_same_training
from workbench.trace.validate import validate_run

pytestmark = pytest.mark.gpu

LOSS_RTOL, NORM_RTOL = 2e-6, 1e-4
SMALL = {"model": "small", "global_batch": 16, "steps": 6}
PIPE = {
    "model": {"base": "gpt2-small", "layers": 4, "vocab_size": 1024},
    "global_batch": 8,
    "steps": 4,
}

CASES = [
    # name, GPUs, config, bytes per step checked against the formula
    ("dp-bucketed", 2, {**SMALL, "dp": 2, "bucket_mb": 1.0}, True),
    ("dp-naive", 2, {**SMALL, "dp": 2, "dp_impl": "naive"}, True),
    ("dp-ring", 2, {**SMALL, "dp": 2, "allreduce": "ring", "bucket_mb": 1.0}, False),
    (
        "dp-hierarchical",
        4,
        {**SMALL, "dp": 4, "allreduce": "hierarchical", "ranks_per_node": 2},
        False,
    ),
    ("dp-bf16-wire", 2, {**SMALL, "dp": 2, "grad_compression": "bf16"}, True),
    ("tp-sp", 2, {**SMALL, "tp": 2, "sequence_parallel": True}, True),
    ("zero1", 2, {**SMALL, "dp": 2, "zero": 1}, True),
    ("zero2", 2, {**SMALL, "dp": 2, "zero": 2, "bucket_mb": 1.0}, True),
    ("zero3", 2, {**SMALL, "dp": 2, "zero": 3}, True),
    ("zero1-offload", 2, {**SMALL, "dp": 2, "zero": 1, "offload_optimizer": True}, True),
    (
        "zero2-offload",
        2,
        {**SMALL, "dp": 2, "zero": 2, "bucket_mb": 1.0, "offload_optimizer": True},
        True,
    ),
    ("zero3-offload", 2, {**SMALL, "dp": 2, "zero": 3, "offload_optimizer": True}, True),
    ("gpipe", 2, {**PIPE, "pp": 2, "schedule": "gpipe", "microbatches": 4}, True),
    ("1f1b", 2, {**PIPE, "pp": 2, "schedule": "1f1b", "microbatches": 4}, True),
    (
        "interleaved",
        2,
        {**PIPE, "pp": 2, "schedule": "interleaved", "virtual_stages": 2, "microbatches": 4},
        True,
    ),
    ("1f1b-pp4", 4, {**PIPE, "pp": 4, "schedule": "1f1b", "microbatches": 4}, True),
    ("3d", 8, {**PIPE, "dp": 2, "tp": 2, "pp": 2, "microbatches": 2}, True),
    ("cp2-ring", 2, {**SMALL, "cp": 2}, True),
    ("cp2-allgather", 2, {**SMALL, "cp": 2, "cp_rotate": "allgather", "cp_balance": "none"}, True),
    # bytes follow the routing
    (
        "ep2-dropless",
        2,
        {**SMALL, "model": "tiny-moe", "dp": 2, "ep": 2},
        False,
    ),
    (
        "ep2-capacity",
        2,
        {**SMALL, "model": "tiny-moe", "dp": 2, "ep": 2, "moe_dispatch": "capacity"},
        False,
    ),
]


def single_of(config: dict) -> dict:
    """The one-GPU run a case must equal: the same model, batch, seed and steps."""
    keep = ("model", "global_batch", "steps", "precision")
    return {k: v for k, v in config.items() if k in keep}


@pytest.mark.parametrize(
    "gpus, config, check_bytes",
    [pytest.param(g, c, b, marks=needs(g), id=n) for n, g, c, b in CASES],
)
def test_every_strategy_on_nccl_equals_one_gpu(launched, gpus, config, check_bytes):
    run = launched(backend="nccl", **config)
    assert run.config["backend"] == "nccl" and run.config["device"] == "cuda"
    assert_same_training(run, launched(backend="nccl", **single_of(config)), LOSS_RTOL, NORM_RTOL)
    assert validate_run(run.path) == []
    for r in run.summary["ranks"]:
        if check_bytes:
            assert r["comm_bytes_per_step"] == r["predicted_comm_bytes_per_step"], r["rank"]
        assert_allocator_explained(r)
        if run.config["pp"] > 1:
            waits = run.events[(run.events.cat == "wait") & (run.events["rank"] == r["rank"])]
            assert waits.dur_us.sum() > 0, (
                f"rank {r['rank']}: a pipeline rank waits, and the trace shows it"
            )
        if config.get("offload_optimizer"):
            assert r["host_peak_bytes"] == pytest.approx(r["predicted_host_bytes"], rel=0.03)
            assert r["peak_bytes"]["optimizer_state"] == 0


def assert_allocator_explained(r: dict) -> None:
    """The categories explain the CUDA allocator's live bytes but for workspaces, and never exceed them."""
    allocated = r["allocator_peak_bytes"]["allocated"]
    unexplained = r["unattributed_bytes"]
    assert unexplained <= 64 * 2**20 + 0.10 * allocated, (r["rank"], unexplained, allocated)
    assert unexplained >= -0.02 * allocated, (
        f"rank {r['rank']}: the categories count more than the allocator holds"
    )


@needs(2)
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_training_on_nccl(launched, precision):
    """bf16 and fp16 (dynamic loss scale) on two GPUs: the loss falls, 18Ψ of model states, the trace valid,
    and the same losses as one GPU within 16-bit rounding (2e-3 relative)."""
    config = {**SMALL, "precision": precision, "steps": 12}
    run = launched(backend="nccl", dp=2, **config)
    m = run.metrics
    assert m.loss.iloc[-1] < m.loss.iloc[0]
    assert_same_training(run, launched(backend="nccl", **config), 2e-3, 5e-2)
    psi = run.config["params"]
    for r in run.summary["ranks"]:
        states = sum(r["peak_bytes"][k] for k in ("parameter", "gradient", "optimizer_state"))
        assert states == 18 * psi
        assert_allocator_explained(r)
    assert validate_run(run.path) == []


@needs(1)
def test_one_gpu_records_the_allocator_and_activations_as_predicted(launched):
    """The CUDA case of the activation formula: fp32 LayerNorm statistics and sdpa's saved extras
    (formulas/activations.py, device='cuda')."""
    for config in (
        {"precision": "fp32"},
        {"precision": "fp32", "attention": "sdpa"},
        {"precision": "bf16", "attention": "sdpa"},
    ):
        run = launched(backend="nccl", **SMALL, **config)
        r = run.summary["ranks"][0]
        assert r["peak_bytes"]["activation"] == r["predicted_bytes"]["activation"], config
        assert_allocator_explained(r)
