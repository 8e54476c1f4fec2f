"""Our AdamW (optim/adamw.py) is torch's AdamW without torch.optim.Optimizer: bit-identical updates and
state, and a rank that builds one does not import torch's compiler (the start-up it saves)."""

import subprocess
import sys

import torch

from workbench.optim.adamw import AdamW


def test_adamw_equals_torch_adamw_bit_for_bit():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = AdamW(ours, lr=3e-3, weight_decay=0.1)
    ref = torch.optim.AdamW(theirs, lr=3e-3, weight_decay=0.1, foreach=False)
    for step, lr in enumerate((3e-3, 1e-2, 5e-4, 2e-3)):
        grads = [torch.randn_like(p) for p in ours]
        for i, (a, b, g) in enumerate(zip(ours, theirs, grads, strict=True)):
            skip = step == 1 and i == 1  # a tensor without a gradient is left alone, as torch does
            a.grad, b.grad = (None, None) if skip else (g.clone(), g.clone())
        opt.param_groups[0]["lr"] = ref.param_groups[0]["lr"] = lr
        opt.step()
        ref.step()
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(opt.state[a][key], ref.state[b][key]), key
    assert opt.param_groups[0]["betas"] == ref.param_groups[0]["betas"]
    assert opt.param_groups[0]["eps"] == ref.param_groups[0]["eps"]


def test_building_and_stepping_a_meta_built_model_does_not_import_the_compiler():
    """torch.optim.Optimizer's constructor, nn.Embedding's init and triu on the meta device each import
    torch._dynamo (~1 s of CPU per rank); a rank's model, its materialisation and its optimizer must not."""
    code = """
import sys, torch
from workbench.model.gpt import GPT
from workbench.engine.parallelize import materialize
from workbench.config import PRESETS
from workbench.optim.adamw import AdamW
with torch.device("meta"):
    model = GPT(PRESETS["tiny"])
materialize(model, torch.device("cpu"))
model.init_weights(0)
x = torch.randint(0, 64, (2, 16))
model(x, x).backward()
AdamW(model.parameters(), lr=1e-3).step()
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out
