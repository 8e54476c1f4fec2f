"""Weight decay as LLMs are trained: only the weight matrices shrink (nanoGPT's and Megatron-LM's groups),
on every layout — whole parameters, ZeRO slices that hold matrices and norms at once, host copies — and
the betas and ε are the run's."""

from itertools import pairwise

import pytest
import torch

import workbench as wb
from tests.test_data_parallel import assert_same_training
from workbench.config.model_config import PRESETS
from workbench.model.gpt import GPT
from workbench.optim.adamw import AdamHyper, AdamW
from workbench.optim.updater import adamw
from workbench.optim.weight_decay import decaying
from workbench.parallel.flat import marked_runs
from workbench.parallel.param_facts import ParamFacts, ParamTable

LR, WD = 0.01, 0.1


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_decay_skips_norms_and_biases(name):
    """With zero gradients Adam's update is 0/(0 + ε) = 0, so one step shows the decay alone: every matrix
    is multiplied by 1 − lr·wd, every gain and bias left as it was — whole, and as a ZeRO slice of a flat
    buffer cut across both kinds."""
    model = GPT(PRESETS[name], seed=0)
    decays = decaying(model)
    named = dict(model.named_parameters())
    facts = ParamTable(
        {p: ParamFacts(decay_ranges=None if decays[n] else ()) for n, p in named.items()}
    )
    before = {n: p.detach().clone() for n, p in named.items()}
    assert {n for n, p in named.items() if not decays[n]} == {
        n for n, p in named.items() if p.dim() == 1
    }
    assert any("ln" in n for n, p in named.items() if not decays[n])
    opt = adamw(list(named.values()), LR, AdamHyper(weight_decay=WD), facts=facts)
    opt.step([torch.zeros_like(p) for p in named.values()])
    for n, p in named.items():
        expected = before[n] * (1 - LR * WD) if decays[n] else before[n]
        assert torch.equal(p.detach(), expected), n

    # the same model's parameters end to end, cut into three slices as ZeRO cuts a bucket
    params = list(named.values())
    flat = torch.cat([before[n].reshape(-1) for n in named])
    cut = [0, flat.numel() // 3, 2 * flat.numel() // 3, flat.numel()]
    slices = [flat[a:b].clone() for a, b in pairwise(cut)]
    opt = AdamW(
        slices,
        lr=LR,
        weight_decay=WD,
        decay=[marked_runs(params, a, b, [decays[n] for n in named]) for a, b in pairwise(cut)],
    )
    opt.step([torch.zeros_like(s) for s in slices])
    whole = torch.cat([p.detach().reshape(-1) for p in params])
    assert torch.equal(torch.cat(slices), whole)  # bit for bit what the whole parameters got


def test_partial_decay_is_torchs_adamw_with_two_groups_bit_for_bit():
    torch.manual_seed(0)
    matrix, gain = torch.randn(6, 4), torch.randn(4)
    flat = torch.nn.Parameter(torch.cat([matrix.reshape(-1), gain]))  # a slice holding both
    ref = [torch.nn.Parameter(matrix.clone()), torch.nn.Parameter(gain.clone())]
    ours = AdamW([flat], lr=3e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=WD, decay=[[(0, 24)]])
    theirs = torch.optim.AdamW(
        [{"params": ref[:1], "weight_decay": WD}, {"params": ref[1:], "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.9, 0.95),
        eps=1e-6,
        foreach=True,
    )
    for _ in range(3):
        g = torch.randn(28)
        flat.grad = g.clone()
        ref[0].grad, ref[1].grad = g[:24].view(6, 4).clone(), g[24:].clone()
        ours.step()
        theirs.step()
        assert torch.equal(flat.detach(), torch.cat([ref[0].detach().reshape(-1), ref[1].detach()]))


DECAY = {"weight_decay": WD, "adam_beta2": 0.95, "model": "tiny-llama"}


@pytest.mark.parametrize(
    "config",
    [
        # make test holds ZeRO slices' decay to the whole parameters' bit for bit in one process (above)
        pytest.param({"dp": 2, "zero": 1}, marks=pytest.mark.slow),
        pytest.param({"dp": 2, "zero": 3}, marks=pytest.mark.slow),
        pytest.param({"dp": 2, "zero": 2, "offload_optimizer": True}, marks=pytest.mark.slow),
        pytest.param(
            {"dp": 2, "optimizer": "onebit-adam", "onebit_warmup_steps": 3}, marks=pytest.mark.slow
        ),
        pytest.param({"precision": "bf16"}, marks=pytest.mark.slow),
    ],
    ids=["zero1", "zero3", "zero2-offload", "onebit", "bf16"],
)
def test_zero_and_offload_decay_what_one_process_decays(launched, config):
    """With decay on (0.1) and β2 0.95, every layout trains what one process trains (the oracle's
    tolerances). 1-bit Adam is AdamW (decay included) for its 3 warm-up steps, so the losses of steps 0–3
    equal one process's; its compressed steps after them differ by design (tests/test_onebit_adam.py holds
    them to their own formula). bf16: within bf16's rounding of fp32 (2e-2)."""
    run = launched(**DECAY, **config)
    if config.get("optimizer") == "onebit-adam":
        single = launched(**DECAY).metrics.loss
        for a, b in zip(run.metrics.loss[:4], single[:4], strict=True):
            assert abs(a - b) <= 1e-5 * b, (list(run.metrics.loss), list(single))
        return
    tol = {"loss_rtol": 2e-2, "norm_rtol": 0.5} if config.get("precision") else {}
    assert_same_training(run, launched(**DECAY), **tol)


@pytest.mark.slow
def test_decay_and_betas_change_the_run(launched):
    """Not vacuous: β2 0.95 with decay trains another model than the defaults."""
    with pytest.raises(AssertionError):
        assert_same_training(launched(**DECAY), launched(model="tiny-llama"))


def test_the_optimizer_settings_are_validated():
    for bad, match in (
        ({"adam_beta2": 1.0}, "below 1"),
        ({"adam_beta1": -0.1}, "adam_beta1"),
        ({"adam_eps": 0.0}, "adam_eps"),
        ({"weight_decay": -1.0}, "weight_decay"),
    ):
        with pytest.raises(wb.ConfigError, match=match):
            wb.RunConfig(**bad).validate()
    wb.RunConfig(adam_beta1=0.0, adam_beta2=0.95, adam_eps=1e-6).validate()  # valid: no error


def test_a_config_written_before_these_fields_loads_with_torchs_defaults():
    """A run directory or checkpoint from before: its config.json has no betas, ε or decay_embeddings, and
    reads back as the optimizer it ran (torch's betas and ε). The optimizer's files are keyed by tensor
    position, not by group, so their layout did not change (tests/test_checkpoint.py resumes them)."""
    old = {
        k: v
        for k, v in wb.RunConfig(weight_decay=0.1).to_dict().items()
        if k not in ("adam_beta1", "adam_beta2", "adam_eps", "decay_embeddings")
    }
    cfg = wb.RunConfig.from_dict(old)
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps, cfg.decay_embeddings) == (
        0.9,
        0.999,
        1e-8,
        True,
    )
