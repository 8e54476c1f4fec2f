"""Models for real GPUs: the GPT-2-shaped presets (built, counted against the formula, one step run at a
reduced sequence length on this CPU), and attention='sdpa' (torch's fused kernel) training the same model
as the written-out attention, with its memory measured against the formula."""

import dataclasses
import math

import pytest
import torch

import workbench as wb
from workbench.config.model_config import PRESETS, lr_warning
from workbench.model.gpt import GPT, CausalSelfAttention, ModelWiring

#: Ψ of each GPT-2-shaped preset by the README's formula, written out: V·h + s·h (embeddings) +
#: L·(12h² + 13h) (blocks) + 2h (final norm) + h·V + V (the untied head and its bias).
GPT2_PARAMS = {"gpt2-small": 163_159_680, "gpt2-medium": 406_432_896, "gpt-1.3b": 1_416_795_264}


@pytest.mark.parametrize("name", list(GPT2_PARAMS))
def test_gpt2_presets_have_the_parameters_the_formula_counts(name):
    cfg = PRESETS[name]
    assert (cfg.vocab_size, cfg.seq_len) == (50304, 1024)
    v, s, h, n = cfg.vocab_size, cfg.seq_len, cfg.hidden, cfg.layers
    assert (
        cfg.param_count()
        == v * h + s * h + n * (12 * h * h + 13 * h) + 2 * h + h * v + v
        == GPT2_PARAMS[name]
    )
    with torch.device("meta"):
        built = GPT(cfg)
    assert sum(p.numel() for p in built.parameters()) == GPT2_PARAMS[name]
    # GPT-2's published 124 M ties the head to the embedding (and counts vocab 50257): ours adds h·V + V
    if name == "gpt2-small":
        tied = GPT2_PARAMS[name] - (h * v + v) - (v - 50257) * h
        assert round(tied / 1e6) == 124


def test_gpt2_small_runs_a_step_at_a_reduced_sequence_length():
    """The real shape (12 × 768, vocab 50304) at sequence 32: loss starts near ln V, a gradient step lowers
    it. The step is plain gradient descent: Adam's 1.3 GB of moments would triple the test's time here
    (first-touch memory), and the optimizers are tested on every layout at small shapes."""
    cfg = dataclasses.replace(PRESETS["gpt2-small"], seq_len=32)
    torch.manual_seed(0)
    model = GPT(cfg, seed=0)  # built on the CPU: initialised by parameter name at once
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    y = torch.roll(x, -1, dims=1)
    losses = []
    for _ in range(2):
        loss = model(x, y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad, alpha=0.5)
        model.zero_grad()
        losses.append(loss.item())
    # near ln V ≈ 10.83 at initialisation (logits of N(0, 0.02) weights over 768 features spread it by ≈0.2)
    assert abs(losses[0] - math.log(cfg.vocab_size)) < 0.3 and losses[1] < losses[0]


def test_the_learning_rate_warning_follows_width():
    assert lr_warning(PRESETS["small"], 3e-3) is None
    assert "try lr ≈ 0.001" in lr_warning(PRESETS["gpt2-small"], 3e-3)
    assert lr_warning(PRESETS["gpt2-small"], 6e-4) is None  # GPT-2 small's published rate
    with pytest.warns(UserWarning, match="hidden=512"):
        # warned before anything starts, then stopped by a bad value
        with pytest.raises(wb.ConfigError):
            wb.launch(wb.RunConfig(model={"hidden": 512, "heads": 8}, lr=3e-3, dp=3))


def test_sdpa_computes_the_written_out_attention():
    torch.manual_seed(0)
    cfg = PRESETS["tiny"]
    attn = CausalSelfAttention(cfg)
    q, k, v = (
        torch.randn(2, cfg.heads, cfg.seq_len, cfg.head_dim, requires_grad=True) for _ in range(3)
    )
    eager = attn.core(q, k, v)
    fused = CausalSelfAttention(cfg, wiring=ModelWiring(fused_attention=True)).core(q, k, v)
    assert torch.allclose(eager, fused, atol=1e-6)


@pytest.mark.slow  # notebook 06 checks the same (losses, activation bytes = formula < eager) in make test
def test_sdpa_trains_the_same_model_and_saves_what_the_formula_says(launched):
    """Same losses as the written-out attention within 1e-5 relative (the fused kernel sums the softmax in
    another order: ≈1e-7); activation memory measured by the saved-tensor hooks equals the formula's
    'fused' count — the s×s probabilities gone, the kernel's log-sum-exp kept."""
    model = {"base": "tiny", "seq_len": 32}
    eager = launched(model=model, global_batch=4, steps=3)
    fused = launched(model=model, global_batch=4, steps=3, attention="sdpa")
    a, b = eager.metrics.loss.to_numpy(), fused.metrics.loss.to_numpy()
    assert (abs(a - b) <= 1e-5 * a).all(), (a, b)
    m, e = fused.summary["ranks"][0], eager.summary["ranks"][0]
    assert m["peak_bytes"]["activation"] == m["predicted_bytes"]["activation"]
    assert m["peak_bytes"]["activation"] < e["peak_bytes"]["activation"]
    with pytest.raises(wb.ConfigError, match="sdpa"):
        wb.RunConfig(attention="sdpa", recompute="selective").validate()


def test_the_activation_formula_has_a_cuda_case():
    """What CUDA's kernels save differently, as the formula counts it (the GPU suite measures it):
    LayerNorm keeps fp32 statistics (4 per layer and token, 2 for the final norm) where a 16-bit CPU run
    keeps them in 16 bits; the fused attention kernel of an fp32 run is CUDA's memory-efficient one, whose
    log-sum-exp pads the sequence to a multiple of 32; both fused kernels keep their generator's seed and
    offset (16 bytes a layer), dropout or not."""
    from workbench.config import ModelConfig
    from workbench.predict.formulas import activation_bytes

    cfg = ModelConfig(seq_len=100, hidden=64, heads=4, layers=2, vocab_size=128)
    b = 2
    stats = (4 * cfg.layers + 2) * cfg.seq_len * b  # two norms per layer, mean and 1/σ each; ln_f's
    assert (
        activation_bytes(cfg, b, 2, device="cuda") - activation_bytes(cfg, b, 2) == (4 - 2) * stats
    )
    assert activation_bytes(cfg, b, 4, device="cuda") == activation_bytes(cfg, b, 4), (
        "fp32: the same"
    )
    fused = {d: activation_bytes(cfg, b, 4, recompute="fused", device=d) for d in ("cpu", "cuda")}
    assert fused["cuda"] - fused["cpu"] == (4 * cfg.heads * (128 - 100) * b + 16) * cfg.layers
