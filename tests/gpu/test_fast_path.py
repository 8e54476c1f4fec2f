"""The GPU acceptance suite, part four: the fast path on one GPU (issue 35; `make test-gpu`).

- our AdamW on CUDA is torch's fused kernel, bit for bit; the loss scale's division, the clipping and the
  skip of a non-finite step folded into it (`grad_scale`, `found_inf`) update as clip_grad_norm_ followed
  by the fused step does, within fp32 rounding (a division by 1/coef where clip_grad_norm_ multiplies by
  coef: one rounding apart), and a non-finite norm leaves parameters, moments and step counters as they were;
- a fast step synchronises the host with the device as often as a plain PyTorch loop of the same model does
  (nanoGPT's: fused AdamW, clip_grad_norm_, loss.item() — one read, plus whatever torch's own kernels need),
  counted by CUDA's own sync debugger (`torch.cuda.set_sync_debug_mode`), where a measured step does many;
- whatever the measure schedule the training is the same: every step measured, none, a few — within 1e-6
  of the loss (the embedding's backward adds rows with atomics on CUDA, so two runs of one schedule differ
  by as much);
- compiled blocks train the eager model: fp32 within 1e-4 of the loss (Triton's reductions sum in other
  orders, ~1e-6 a step; six steps of Adam), bf16 within 2e-2;
- summary.json carries the run's MFU on its GPU.
"""

import os
import tempfile
import warnings

import pytest
import torch

from tests.gpu.gpus import needs
from workbench.trace.validate import validate_run

pytestmark = pytest.mark.gpu

ONE = {"model": "small", "global_batch": 16, "steps": 6, "backend": "nccl"}


@needs(1)
def test_our_adamw_on_cuda_is_torchs_fused_adamw():
    from workbench.optim.adamw import AdamW, apply_update

    torch.manual_seed(0)
    shapes = ((64, 33), (1000,), (7,))
    ours = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = AdamW(ours, lr=3e-3, weight_decay=0.1)
    ref = torch.optim.AdamW(theirs, lr=3e-3, weight_decay=0.1, fused=True)
    assert opt.fused and all(opt.state_of(p)["step"].is_cuda for p in ours), (
        "step counters on the device"
    )
    for lr in (3e-3, 1e-2, 5e-4):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        opt.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = lr
        opt.step()
        ref.step()
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    # clipping folded into the kernel against clip_grad_norm_ then the fused step
    for a, b in zip(ours, theirs, strict=True):
        a.grad = 5 * torch.randn_like(a)
        b.grad = a.grad.clone()
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in ours]))
    apply_update(opt, [p.grad for p in ours], norm, max_norm=1.0)
    torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    ref.step()
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # a non-finite norm: nothing moves, the step counters neither
    before = [
        (p.detach().clone(), {k: v.clone() for k, v in opt.state_of(p).items()}) for p in ours
    ]
    apply_update(
        opt, [torch.randn_like(p) for p in ours], torch.tensor(float("nan"), device="cuda"), 1.0
    )
    for p, (value, state) in zip(ours, before, strict=True):
        assert torch.equal(p, value) and all(
            torch.equal(opt.state_of(p)[k], v) for k, v in state.items()
        )


def _sync_counts(rank: int, run_dir: str, precision: str, out: str) -> None:
    """On one NCCL rank: step 0 measured, steps 1..3 fast, each under CUDA's sync debugger; writes the counts."""
    import json
    from datetime import timedelta

    import torch.distributed as dist

    from workbench.config import RunConfig
    from workbench.engine.batches import Batches
    from workbench.engine.context import setup
    from workbench.engine.parallelize import parallelize
    from workbench.engine.train_step import train_step
    from workbench.model.gpt import GPT, ModelWiring

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        store=dist.FileStore(os.path.join(run_dir, "store"), 1),
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
        device_id=torch.device("cuda", 0),
    )
    os.environ["WORKBENCH_RESOLVED_BACKEND"] = "nccl"
    cfg = RunConfig(
        model="small", steps=5, precision=precision, attention="sdpa", backend="nccl"
    ).validate()
    ctx = setup(cfg, run_dir)
    strategy = parallelize(cfg, ctx)
    batches = Batches(cfg, ctx.device, dp_index=0, dp_size=1)
    counts = [
        syncs(lambda s=step: train_step(strategy, batches, s, config=cfg, measured=s == 0))
        for step in range(5)
    ]
    # the attention: sdpa, as ours
    model = GPT(cfg.model_config, seed=0, wiring=ModelWiring(fused_attention=True)).to(
        ctx.device, torch.bfloat16 if precision == "bf16" else torch.float32
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=True)

    def plain(step: int) -> float:
        x, y = batches.get(step)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    baseline = [syncs(lambda s=step: plain(s)) for step in range(3)]
    with open(out, "w") as f:
        json.dump({"ours": counts, "plain": baseline}, f)
    dist.destroy_process_group()


def syncs(fn) -> int:
    """How many synchronising CUDA calls `fn` makes (CUDA's sync debugger warns at each)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@needs(1)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_fast_step_synchronises_once(precision):
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "counts.json")
        mp.start_processes(_sync_counts, args=(d, precision, out), nprocs=1, start_method="spawn")
        with open(out) as f:
            counts = json.load(f)
    ours, plain = counts["ours"], counts["plain"]
    assert plain[1] >= 1 and ours[0] > plain[1], (
        f"a measured step synchronises at every span: {counts}"
    )
    assert ours[2:] == [plain[1]] * 3, (
        f"a fast step waits where a plain loop does, nowhere else: {counts}"
    )


@needs(1)
def test_the_same_training_whatever_is_measured_on_the_gpu(launched):
    runs = [launched(**ONE, measure=spec) for spec in ("all", "none", "2:4")]
    for run in runs[1:]:
        diff = ((run.metrics.loss - runs[0].metrics.loss).abs() / runs[0].metrics.loss).max()
        assert diff < 1e-6, (run.config["measure"], diff)
        assert validate_run(run.path) == []
    r = runs[2].summary["ranks"][0]
    assert r["measured_steps"] == [2, 3] and r["measure_cost"] > 0
    mfu = runs[1].summary["mfu"]
    assert mfu["value"] is None or 0 < mfu["value"] < 1, mfu


@needs(1)
@pytest.mark.parametrize("precision, rtol", [("fp32", 1e-4), ("bf16", 2e-2)])
def test_compiled_blocks_train_the_eager_model_on_the_gpu(launched, precision, rtol):
    config = {**ONE, "precision": precision, "attention": "sdpa"}
    eager, compiled = launched(**config), launched(**config, compile=True)
    diff = ((compiled.metrics.loss - eager.metrics.loss).abs() / eager.metrics.loss).max()
    assert diff < rtol, diff
    assert validate_run(compiled.path) == []
