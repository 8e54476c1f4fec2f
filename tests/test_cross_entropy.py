"""The blocked loss (model/cross_entropy.py): the same loss and gradient as `F.cross_entropy(logits.float())`,
and a peak that falls by at least the fp32 copy of the logits, read from the CPU allocator (torch.profiler's
running total of every allocation). The tolerance, 1e-6 relative on the loss: both are fp32 throughout, and
only the order of the sums differs (the log-sum-exp a block at a time against the log-softmax's), each sum of V
terms off by at most about log2(V) × fp32's 6e-8. The gradient, rounded once to the logits' dtype by both: equal
within fp32's rounding (fp32 logits) or one bf16 step at the boundary of a rounding (bf16)."""

import json
import os
import tempfile

import pytest
import torch
import torch.nn.functional as F

from workbench.model import cross_entropy as ce

N, V = 256, 8192  # tokens, vocabulary: a 2 MiB block is 64 rows, so 4 blocks


def reference(logits, targets):
    return F.cross_entropy(logits.float(), targets)  # what model/gpt.py's head did before


def _run(loss_fn, dtype):
    """(loss, gradient, the allocator's peak rise above the logits during forward and backward, bytes)."""
    torch.manual_seed(0)
    logits = (3 * torch.randn(N, V)).to(dtype).requires_grad_()
    targets = torch.randint(V, (N,))
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        loss = loss_fn(logits, targets)
        loss.backward()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = sorted(
                (e for e in json.load(f)["traceEvents"] if e.get("name") == "[memory]"),
                key=lambda e: e["ts"],
            )
    first = events[0]["args"]
    before = int(first["Total Allocated"]) - int(first["Bytes"])
    return loss.item(), logits.grad, max(int(e["args"]["Total Allocated"]) for e in events) - before


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(ce, "BLOCK_BYTES", 2 * 2**20)


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_blocked_loss_is_the_fp32_cross_entropy(dtype):
    loss, grad, _ = _run(ce.cross_entropy, dtype)
    ref_loss, ref_grad, _ = _run(reference, dtype)
    assert abs(loss - ref_loss) <= 1e-6 * ref_loss, (loss, ref_loss)
    assert grad.dtype == dtype
    if dtype == torch.float32:
        assert torch.allclose(grad, ref_grad, rtol=1e-5, atol=1e-9)
    else:  # the fp32 values differ in their last bits, so a few round to the neighbouring bf16 value
        differ = grad != ref_grad
        assert differ.float().mean() < 1e-3
        step = torch.finfo(torch.bfloat16).eps * ref_grad.float().abs()
        assert ((grad.float() - ref_grad.float()).abs() <= step)[differ].all()


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_peak_falls_by_the_fp32_copy_of_the_logits(dtype):
    """Measured: the old loss's peak holds the fp32 copy (bf16), the log-softmax and the two fp32 gradients of
    backward; the blocked one holds one gradient in the logits' dtype and a block's temporaries."""
    _, _, blocked = _run(ce.cross_entropy, dtype)
    _, _, before = _run(reference, dtype)
    fp32_copy = 4 * N * V
    assert before - blocked >= fp32_copy, (before, blocked, fp32_copy)
    width = torch.finfo(dtype).bits // 8
    assert blocked <= width * N * V + 4 * ce.BLOCK_BYTES, "one gradient and a few blocks, no more"


@pytest.mark.usefixtures("small_blocks")
def test_a_row_longer_than_a_block_is_a_block_of_its_own():
    assert [(s.start, s.stop) for s in ce.row_blocks(3, 10**9)] == [(0, 1), (1, 2), (2, 3)]
    assert [(s.start, s.stop) for s in ce.row_blocks(300, 8192)] == [
        (0, 64),
        (64, 128),
        (128, 192),
        (192, 256),
        (256, 300),
    ]


def test_the_formulas_block_is_the_loss_s():
    """predict/ has no torch, so it keeps its own copy of the block size the loss allocates by."""
    from workbench.predict.formulas.activations import LOSS_BLOCK_BYTES

    assert LOSS_BLOCK_BYTES == ce.BLOCK_BYTES == 64 * 2**20
