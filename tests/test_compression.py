"""Gradient compression: buckets cast to bf16/fp16 for the all-reduce and back, as torch DDP's
`bf16_compress_hook` / `fp16_compress_hook` do — the same gradients as DDP with the hook, half the bytes on
the wire (trace, summary and prediction agree)."""

import pytest

from tests.distributed import make_comm, run_ranks
from workbench import ConfigError, RunConfig

STEPS = 4


def _against_ddp(rank, world, dtype_name):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.config import PRESETS
    from workbench.data.synthetic import global_batch, shard_rows
    from workbench.model.gpt import GPT
    from workbench.parallel.data_parallel import BucketedDataParallel

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}[
        dtype_name
    ]
    cfg = PRESETS["tiny"]
    ours = GPT(cfg, seed=0)
    sync = BucketedDataParallel(
        ours, make_comm(rank, world, dp=world), bucket_mb=0.02, compression=dtype
    )
    ref = DDP(GPT(cfg, seed=0), bucket_cap_mb=0.02, broadcast_buffers=False)
    # DDP refuses its bf16 hook off CUDA by the hook's name; gloo reduces bf16 fine, so the same
    # function runs under another name
    ref.register_comm_hook(None, lambda state, bucket: hook(state, bucket))
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3, foreach=False) for m in (ours, ref)]
    for step in range(STEPS):
        x, y = global_batch(0, step, 16, cfg.seq_len, cfg.vocab_size)
        x, y = shard_rows(x, rank, world), shard_rows(y, rank, world)
        losses = []
        for model, opt in zip((ours, ref), opts, strict=True):
            loss = model(x, y)
            loss.backward()
            if model is ours:
                sync.wait()
            opt.step()
            losses.append(loss.item())
            if model is ours:
                sync.zero_grad()
            else:
                opt.zero_grad()
        # each element is cast, divided and summed alike: the same gradients up to the sum's order
        assert abs(losses[0] - losses[1]) <= 1e-6 * abs(losses[1]), (step, losses)
    for a, b in zip(ours.parameters(), ref.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
def test_compressed_buckets_equal_ddp_with_its_compress_hook(dtype):
    run_ranks(_against_ddp, 2, dtype)


@pytest.mark.slow  # notebook 09 checks the halving (measured) and equal losses in make test
def test_compression_halves_the_bytes_on_the_wire(launched):
    full, half = launched(dp=2), launched(dp=2, grad_compression="bf16")
    psi = full.config["params"]
    for r in half.summary["ranks"]:
        assert r["comm_bytes_per_step"]["all_reduce"]["dp"] == 4 + 2 * psi, (
            "bf16 on the wire, plus the loss"
        )
        assert r["comm_bytes_per_step"] == r["predicted_comm_bytes_per_step"]
        assert r["peak_bytes"]["comm_buffer"] == 2 * psi == r["predicted_bytes"]["comm_buffer"]
    assert (full.metrics.loss - half.metrics.loss).abs().max() < 0.01, (
        "bf16 rounding of the gradients only"
    )
    ops = [
        e["args"]["dtype"]
        for e in half.traces[0]["traceEvents"]
        if e.get("ph") == "b" and e["name"].startswith("all_reduce bucket")
    ]
    assert ops and set(ops) == {"bfloat16"}


def test_compression_needs_fp32_buckets():
    with pytest.raises(
        ConfigError, match="grad_compression='bf16' compresses fp32 gradient buckets"
    ):
        RunConfig(dp=2, zero=1, grad_compression="bf16").validate()
