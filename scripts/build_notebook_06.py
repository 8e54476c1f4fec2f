"""Regenerates notebooks/06_training_techniques.ipynb (outputs stripped). Edit here, then run it."""
from notebook_cells import code, md, write

write([
md("""
# 6 · Training techniques: mixed precision, loss scaling, accumulation, recomputation, warm-up

Each technique trades one resource for another; each is run here for real and measured beside what
the formulas say.
"""),
code("""
import os
import pandas as pd
import plotly.express as px
import workbench as wb
from workbench import viz
from workbench.predict import formulas
from workbench.config import PRESETS

OUT = os.path.join("..", "traces", "nb06")

def run(name, **config):
    config.setdefault("steps", 8)
    return wb.launch(wb.RunConfig(model="tiny", global_batch=16, seed=0, **config), out=os.path.join(OUT, name),
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
assert list(m.skipped).index(True) == 3
px.line(m, x="step", y="loss_scale", markers=True, title="fp16 loss scale (log)", log_y=True,
        hover_data=["skipped"]).show()
m[["step", "loss", "loss_scale", "skipped", "grad_norm"]]
"""),
md("""
## Gradient accumulation

With dp = 2, each rank's 8 sequences of the global batch of 16 run as four microbatches of 2: their
gradients accumulate into the same gradient as one pass over the 8 — the same model as one pass, and
the data-parallel all-reduce runs only after the last microbatch's backward.
"""),
code("""
acc = {"one batch of 16": run("batch16", dp=2), "4 microbatches of 2 per rank": run("accum4", dp=2, microbatches=4)}
assert viz.compare_losses(acc, "one batch of 16").max_abs_diff.max() < 1e-5
viz.timeline(acc["4 microbatches of 2 per rank"], steps=[7], ranks=[0],
             title="4 forward/backward pairs, one all-reduce at the end").show()
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
assert (table["peak measured"] == table["peak predicted"]).all()
table
"""),
code("""
viz.timeline(rc["full"], steps=[7], title="full recomputation: each block reruns inside backward").show()
assert viz.compare_losses(rc, "none").max_abs_diff.max() == 0.0
"""),
md("## Learning-rate warm-up, then cosine decay"),
code("""
lr_run = run("warmup-cosine", lr_schedule="cosine", warmup_steps=5, steps=30, lr=3e-3)
px.line(lr_run.metrics, x="step", y=["lr"], title="learning rate: 5 warm-up steps, cosine to 10 %").show()
px.line(lr_run.metrics, x="step", y="loss", title="loss").show()
"""),
], "06_training_techniques.ipynb")
