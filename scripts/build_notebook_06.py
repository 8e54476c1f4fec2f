"""Regenerates notebooks/06_training_techniques.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 6 · Training techniques: mixed precision, loss scaling, accumulation, recomputation, warm-up

Each technique trades one resource for another; each is run here for real and measured beside what
the formulas say.
"""),
        code("""
import os
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.subplots import make_subplots
import workbench as wb
from workbench import viz
from workbench.predict import formulas
from workbench.config import PRESETS

OUT = os.path.join("..", "traces", "nb06")

def run(name, **config):
    config = {"model": "tiny", "global_batch": 16, "seed": 0, "steps": 8, **config}
    return wb.launch(wb.RunConfig(**config), out=os.path.join(OUT, name),
                     force=True)  # re-running the notebook replaces its own runs
"""),
        md("""
## Mixed precision: 18Ψ or 16Ψ, measured

16-bit parameters (2Ψ); fp32 master weights, momentum and variance (12Ψ). The gradients: by default,
as in Megatron-LM, each parameter's gradient accumulates and is all-reduced in an fp32 `main_grad`
(4Ψ: 18Ψ in all), which then *is* the master weight's gradient. With `grad_reduce_dtype="bf16"` they stay
in 16 bits (2Ψ, the ZeRO paper's 16Ψ, half the bytes on the wire), and the update makes fp32 copies of
them (4Ψ, counted as `temporary` while they live, after backward). bf16 has fp32's exponent range; fp16
does not, so its loss is multiplied by a scale before backward and the gradients divided by it after.
"""),
        code("""
mp = {"fp32": run("fp32", dp=2, steps=20), "bf16": run("bf16", dp=2, precision="bf16", steps=20),
      "bf16, 16-bit reduce": run("bf16r", dp=2, precision="bf16", grad_reduce_dtype="bf16", steps=20),
      "fp16": run("fp16", dp=2, precision="fp16", steps=20)}
viz.loss_curves(mp).show()
psi = mp["fp32"].config["params"]
states = ("parameter", "gradient", "optimizer_state", "temporary")
table = pd.DataFrame({name: {**{k: r.summary["ranks"][0]["peak_bytes"][k] / psi for k in states},
                             "all-reduce bytes": r.summary["ranks"][0]["comm_bytes_per_step"]["all_reduce"]["dp"] / psi}
                      for name, r in mp.items()}).rename_axis("bytes per parameter (measured)")
table
"""),
        md("""
## fp16: an overflow skips its step and lowers the scale

An overflow is injected into rank 1's gradients at step 3. Every rank sees it (a max all-reduce of an
inf flag), skips the update, halves the scale; after `loss_scale_growth_interval` good steps the scale
doubles again.
"""),
        code("""
ov = run("overflow", dp=2, precision="fp16", fault="overflow", fault_rank=1, fault_step=3,
         loss_scale_growth_interval=3, steps=10)
m = ov.metrics
viz.check("the overflow is skipped at step 3", "skipped[3] and not any(skipped[:3])", skipped=list(m.skipped))
fig = go.Figure(go.Scatter(x=m.step, y=m.loss_scale, mode="lines+markers", name="loss scale",
                           line={"color": "#4C78A8"}))
fig.add_trace(go.Scatter(x=m.step[m.skipped], y=m.loss_scale[m.skipped], mode="markers", name="overflow: step skipped",
                         marker={"symbol": "x", "size": 14, "color": "#E45756"}))
ticks = sorted(set(m.loss_scale))
fig.update_layout(title="fp16 loss scale: halved on the overflow, doubled after 3 good steps", height=340,
                  xaxis_title="step", yaxis={"type": "log", "title": "loss scale", "tickvals": ticks,
                                             "ticktext": [f"{t:,.0f}" for t in ticks]})
fig.show()
# the overflowed step's norm is inf or NaN (metrics.jsonl writes null for it and names it in `nonfinite`)
scale_table = m[["step", "loss", "loss_scale", "skipped", "grad_norm"]].astype({"grad_norm": object})
scale_table.fillna({"grad_norm": "non-finite"})
"""),
        md("""
### Why scale at all: gradients at the bottom of fp16's range

fp16 keeps 5 exponent bits: its smallest normal number is 2⁻¹⁴ ≈ 6.1e-5, its smallest subnormal
2⁻²⁴ ≈ 6e-8 (below it, zero), its largest 65,504. A gradient is a small number: below, every gradient
value of one backward pass of the `small` model (4 layers, hidden 256), computed in fp32, as a
histogram of log₂|g|. Those left of 2⁻¹⁴ lose precision as subnormals, those left of 2⁻²⁴ become zero —
and most of fp16's range, up to 2¹⁶, is unused. Multiplying the loss by a scale S multiplies every
gradient by S (backward is linear): the histogram slides right. *Predict first:* how large can S be
before the largest gradient overflows? Move log₂(S).
"""),
        code("""
import numpy as np
import torch
import ipywidgets as widgets
import plotly.graph_objects as go
from workbench.model.gpt import GPT

torch.manual_seed(0)
small = GPT(PRESETS["small"])
tokens = torch.randint(0, PRESETS["small"].vocab_size, (4, PRESETS["small"].seq_len + 1))
small(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()).backward()
g = torch.cat([p.grad.flatten() for p in small.parameters()]).abs()
log2g = torch.log2(g[g > 0]).numpy()
MIN_NORMAL, MIN_SUBNORMAL, MAX_FP16 = -14, -24, np.log2(65504)

def shares(log2_scale):
    x = log2g + log2_scale
    return {"zero (underflow)": (x < MIN_SUBNORMAL).mean(), "subnormal (precision lost)":
            ((x >= MIN_SUBNORMAL) & (x < MIN_NORMAL)).mean(), "normal": ((x >= MIN_NORMAL) & (x <= MAX_FP16)).mean(),
            "inf (overflow)": (x > MAX_FP16).mean()}

counts, edges = np.histogram(log2g, bins=np.arange(-64, 24, 0.5))   # binned once: 3 M values, 176 bars

def scale_chart(log2_scale=0):
    fig = go.Figure(go.Bar(x=edges[:-1] + 0.25 + log2_scale, y=counts, width=0.5, marker_color="#4C78A8",
                           name="gradients × S"))
    for at, label, color in ((MIN_SUBNORMAL, "2⁻²⁴ smallest subnormal", "#E45756"),
                             (MIN_NORMAL, "2⁻¹⁴ smallest normal", "#F58518"), (MAX_FP16, "65,504 largest", "#54A24B")):
        fig.add_vline(x=at, line_dash="dash", line_color=color, annotation_text=label, annotation_textangle=-90)
    s = shares(log2_scale)
    fig.update_layout(xaxis={"title": "log₂ |gradient × S|", "range": [-40, 20]}, yaxis_title="values", height=360,
                      title=f"S = 2^{log2_scale}: " + ", ".join(f"{k} {100 * v:.2f} %" for k, v in s.items()))
    fig.show()

widgets.interact(scale_chart, log2_scale=widgets.IntSlider(value=0, min=0, max=24, description="log₂(S)"));
"""),
        code("""
unscaled, scaled = shares(0), shares(8)
viz.check("unscaled, some gradients underflow or go subnormal in fp16; scaled by 2⁸ under 1 % do, none overflows",
          "unscaled_lost > 0.01 and scaled_lost < 0.01 and scaled_overflow == 0",
          unscaled_lost=unscaled["zero (underflow)"] + unscaled["subnormal (precision lost)"],
          scaled_lost=scaled["zero (underflow)"] + scaled["subnormal (precision lost)"],
          scaled_overflow=scaled["inf (overflow)"])
pd.DataFrame({"S = 1": unscaled, "S = 2⁸": scaled}).map(lambda v: f"{100 * v:.3f} %")
"""),
        md("""
Gradients shrink further as training goes on and in deeper models (Micikevicius et al. 2018 found most
of an SSD network's activation gradients below fp16's range). Too large a scale overflows instead: the
dynamic scaler above starts high, halves on every overflow and doubles after a run of good steps, so it
sits just below the largest scale that does not overflow. bf16 keeps fp32's 8 exponent bits, so it needs
no scaling.
"""),
        md("""
## Gradient accumulation

With dp = 2, each rank's 8 sequences of the global batch of 16 run as four microbatches of 2: their
gradients accumulate into the same gradient as one pass over the 8 — the same model as one pass, and
the data-parallel all-reduce runs only after the last microbatch's backward.

What it is for: **memory**. Only one microbatch's activations are alive at a time, so the activation
peak is a quarter of one pass over the whole batch — the way to train with a global batch whose
activations would not fit, at the price of four smaller (less efficient) passes. Predict first, in the box
below.
"""),
        code("""
guess = viz.predict("Accumulating over 4 micro-batches: what percentage of one whole-batch pass's activation peak "
                    'remains?', unit=' %')
guess
"""),
        code("""
acc = {"one batch of 16": run("batch16", dp=2), "4 microbatches of 2 per rank": run("accum4", dp=2, microbatches=4)}
viz.check("accumulating equals one batch within 1e-5",
          "difference < 1e-5", difference=viz.compare_losses(acc, "one batch of 16").max_abs_diff)
viz.timeline(acc["4 microbatches of 2 per rank"], steps=[7], ranks=[0],
             title="4 forward/backward pairs, one all-reduce at the end").show()
acc_mem = pd.DataFrame({name: {"activation peak (MB)": r.summary["ranks"][0]["peak_bytes"]["activation"] / 1e6,
                               "total at once (MB)": r.summary["ranks"][0]["peak_total_bytes"] / 1e6,
                               "median step (ms)": 1e3 * r.metrics.step_time_s.iloc[1:].median()}
                        for name, r in acc.items()}).T
share = acc_mem["activation peak (MB)"].iloc[1] / acc_mem["activation peak (MB)"].iloc[0]
viz.check("accumulating over 4 microbatches keeps ≈ 1/4 of the activation peak", "abs(share - 0.25) < 0.02",
          share=share)
acc_mem.round(3)
"""),
        code("""
guess.reveal(100 * share, "One micro-batch's activations are alive at a time: a quarter of the batch.")
"""),
        md("""
The activation peak is a quarter; the total a rank pays falls by less, because the model states (16Ψ,
the same in both) do not shrink — on this tiny model they are most of it. On a large model with long
sequences the activations dominate, and accumulation is what lets the batch grow without more memory.
"""),
        md("""
## Activation recomputation

Full recomputation keeps only each block's input and reruns the block in backward (the `recompute`
spans); selective recomputation drops only the attention softmax (the a·s²·b term, which dominates for
long sequences). Measured peaks beside the formula, which counts what each block keeps and what one
rerun rebuilds:
"""),
        code("""
rc = {mode: run(f"recompute-{mode}", recompute=mode) for mode in ("none", "selective", "full")}
cfg = PRESETS["tiny"]
rows = []
for mode, r in rc.items():
    s = r.summary["ranks"][0]
    kept, rerun = formulas.recompute_activation_bytes(cfg, 16, 4, recompute=mode)
    rows.append({"recompute": mode, "kept per block (formula)": kept, "one rerun (formula)": rerun,
                 "peak measured": s["peak_bytes"]["activation"], "peak predicted": s["predicted_bytes"]["activation"],
                 "step ms": 1e3 * r.metrics.step_time_s.median()})
table = pd.DataFrame(rows)
viz.check("activation peaks measured = predicted", "measured == predicted", measured=table["peak measured"],
          predicted=table["peak predicted"])
table
"""),
        code("""
viz.timeline(rc["full"], steps=[7], title="full recomputation: each block reruns inside backward").show()
viz.check("recomputation changes no loss, to the bit", "difference == 0",
          difference=viz.compare_losses(rc, "none").max_abs_diff);
"""),
        md("""
## Fused attention: `attention="sdpa"`

The written-out attention keeps the s × s softmax probabilities of every head for backward (the a·s²·b
term). torch's `scaled_dot_product_attention` (flash or memory-efficient attention on GPUs) recomputes
them inside its backward and keeps only one log-sum-exp per row. Both run here on a sequence of 128,
where the s² term matters; the activation bytes are what autograd really saved (the saved-tensor hooks):
"""),
        code("""
LONG = {"base": "tiny", "seq_len": 128}
attn = {kind: run(f"attention-{kind}", model=LONG, global_batch=4, steps=3, attention=kind)
        for kind in ("eager", "sdpa")}
attn_mem = pd.DataFrame({kind: {"activation peak (MB)": r.summary["ranks"][0]["peak_bytes"]["activation"] / 1e6,
                                "predicted (MB)": r.summary["ranks"][0]["predicted_bytes"]["activation"] / 1e6,
                                "final loss": r.metrics.loss.iloc[-1]} for kind, r in attn.items()}).T
a, b = attn["eager"].metrics.loss.to_numpy(), attn["sdpa"].metrics.loss.to_numpy()
viz.check("the same losses (within 1e-5 relative: the fused kernel sums the softmax in another order)",
          "abs(sdpa - eager) <= 1e-5 * eager", sdpa=b, eager=a)
viz.check("sdpa keeps fewer activation bytes than the written-out attention, as predicted",
          "sdpa_MB < eager_MB and all(abs(measured_MB - predicted_MB) < 1e-9)",
          sdpa_MB=attn_mem["activation peak (MB)"]["sdpa"], eager_MB=attn_mem["activation peak (MB)"]["eager"],
          measured_MB=attn_mem["activation peak (MB)"], predicted_MB=attn_mem["predicted (MB)"])
attn_mem
"""),
        md("""
## Learning-rate warm-up: with and without

Adam divides each step by a running estimate of the gradient's spread, and in the first steps that
estimate rests on a handful of gradients: the very first update moves every weight by about the full
learning rate whatever its gradient. At a high learning rate those first steps throw the model into a
poor region it takes long to leave. A linear warm-up starts small and lets the estimates settle first.
*Predict first:* which run ends lower after 40 steps? Two runs of the same model, data and peak rate
(3e-2, ten times this model's usual), cosine decay, with and without 10 warm-up steps:
"""),
        code("""
warm = {"no warm-up": run("lr-no-warmup", lr_schedule="cosine", warmup_steps=0, steps=40, lr=3e-2),
        "10 warm-up steps": run("lr-warmup", lr_schedule="cosine", warmup_steps=10, steps=40, lr=3e-2)}
fig = make_subplots(rows=1, cols=2, subplot_titles=("learning rate", "loss"))
for (name, r), color in zip(warm.items(), ("#E45756", "#4C78A8")):
    fig.add_trace(go.Scatter(x=r.metrics.step, y=r.metrics.lr, name=name, line={"color": color},
                             legendgroup=name), row=1, col=1)
    fig.add_trace(go.Scatter(x=r.metrics.step, y=r.metrics.loss, name=name, line={"color": color},
                             legendgroup=name, showlegend=False), row=1, col=2)
fig.update_xaxes(title_text="step")
fig.update_layout(height=380, title="the same peak learning rate, with and without warm-up")
fig.show()
ends = {name: r.metrics.loss.iloc[-5:].mean() for name, r in warm.items()}
viz.check("with warm-up the loss ends lower (mean of the last 5 steps)",
          "with_warm_up < without", with_warm_up=ends["10 warm-up steps"], without=ends["no warm-up"]);
"""),
        md("""
## Reading the model back: a sample before and after training on text

Losses are numbers; a sample shows what they mean. `small-llama` with a byte vocabulary (256 tokens) trains
on this repository's architecture guide (`data="text:docs/architecture.md"`: its bytes are the tokens, its
last 10 % held out for the validation loss every 20 steps), and writes a checkpoint at the end. Before
training, the model is its initialisation — built here exactly as every rank builds it, from the seed — and
its sample is noise; `wb.sample` reads the trained checkpoint back on this one process (any layout: here
dp = 2) and continues the same prompt. *Predict first:* after 60 steps (about 20 seconds here) on 40 kB of
text, words or not?
"""),
        code("""
import torch
from workbench.engine.sample import generate
from workbench.model.gpt import GPT

GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(wb.__file__))), "docs", "architecture.md")
TEXT = {"model": {"base": "small-llama", "vocab_size": 256}, "data": f"text:{GUIDE}", "dp": 2, "steps": 60,
        "lr": 3e-3, "lr_schedule": "cosine", "warmup_steps": 10, "weight_decay": 0.1, "adam_beta2": 0.95,
        "eval_every": 20, "checkpoint_every": 60}
prompt = "The workbench "
untrained = GPT(wb.RunConfig(**TEXT).model_config, seed=0)
before = bytes(generate(untrained, list(prompt.encode()), 80, temperature=0.8, top_k=40)).decode("utf-8", "replace")
text_run = run("llama-on-text", **TEXT)
after = wb.sample(text_run.path, prompt=prompt, tokens=80, temperature=0.8, top_k=40)
print("before training:", repr(prompt + before))
print("after training: ", repr(after.text))
val = text_run.metrics.val_loss.dropna()
viz.check("the held-out loss falls as it trains (the guide's last 10 %, never trained on)",
          "last < first - 0.2", first=val.iloc[0], last=val.iloc[-1])
viz.loss_curves({"small-llama on docs/architecture.md": text_run}).show()
"""),
        md("""
Before: bytes drawn almost uniformly from 256, most of them not even printable. After 60 steps: letters,
spaces and punctuation in English proportions, short fragments of words — a model that has learned the
bytes' statistics, not yet the words (the held-out loss: about 3.0 nats a byte against ln 256 = 5.5 at the
start). The guides' own run of this model (docs/guide/models-and-data.md), 200 steps, reaches 2.39
and begins to spell.
"""),
    ],
    "06_training_techniques.ipynb",
)
