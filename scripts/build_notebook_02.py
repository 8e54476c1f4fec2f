"""Regenerates notebooks/02_tensor_parallel.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 2 · Tensor parallelism (Megatron-style), with sequence parallelism

Tensor parallelism splits each **weight matrix** over t ranks (Shoeybi et al. 2019). A transformer
block needs only two collectives each way:

- **column-parallel** `attn.qkv` and `mlp.fc`: rank j holds a slice of the output rows (its attention
  heads, its quarter of the MLP). Before them sits **f**: identity in forward, **all-reduce** of the
  input gradient in backward.
- **row-parallel** `attn.proj` and `mlp.proj`: rank j holds the matching input columns; each rank's
  product is a partial sum, so after them sits **g**: **all-reduce** in forward, identity in backward.
- the embedding and the head are split by **vocabulary**; the loss is computed on vocabulary slices
  (max, sum of exponentials and the target's logit are all-reduced: one number per token), so the full
  logits are never gathered.

**Sequence parallelism** (Korthikanti et al. 2022) turns each all-reduce into a reduce-scatter plus
an all-gather of the same bytes, and keeps the layer norms' activations split along the sequence.
Like Megatron, our column-parallel layers then keep only their slice of the input and gather it
again in backward: 2L + 1 more all-gathers per step, traded for activation memory — the table below
shows both sides of that trade.
"""),
        code("""
import os
import pandas as pd
import workbench as wb
from workbench import viz
from workbench.predict import formulas
from workbench.config import PRESETS

OUT = os.path.join("..", "traces", "nb02")
STEPS = 6

def run(name, **config):
    return wb.launch(wb.RunConfig(model="tiny", steps=STEPS, global_batch=16, seed=0, **config),
                     out=os.path.join(OUT, name), force=True)

runs = {
    "1 process": run("dp1"),
    "tp=2": run("tp2", tp=2),
    "tp=4": run("tp4", tp=4),
    "tp=2 + sequence parallel": run("tp2-sp", tp=2, sequence_parallel=True),
    "tp=4 + sequence parallel": run("tp4-sp", tp=4, sequence_parallel=True),
    "dp=2 × tp=2": run("dp2-tp2", dp=2, tp=2, bucket_mb=0.05),
}
"""),
        md("## The splits, drawn from the shapes each rank held"),
        code("""
viz.tp_shards(runs["tp=4"]).show()
viz.shard_table(runs["tp=2"]).query("rank == 0").head(12)
"""),
        md("""
## The same model as one process

Same seed and global batch; every tp rank starts from slices of exactly the single-process weights.
"""),
        code("""
table = viz.compare_losses(runs, baseline="1 process")
viz.check("every run's losses equal one process's within 1e-5 × loss", "difference <= 1e-5 * loss",
          difference=table.max_abs_diff, loss=table.final_loss)
table
"""),
        code("""
viz.loss_curves(runs, baseline="1 process").show()
"""),
        md("""
## Where each collective sits

Forward: `g` all-reduces after each row-parallel layer (inside the blue forward span); backward: the
`f` all-reduces before the column-parallel layers. With sequence parallelism the same places hold
all-gathers and reduce-scatters. Hover a bar for its layer, direction and bytes.
"""),
        code("""
viz.timeline(runs["tp=2"], steps=[STEPS - 1], title="tp=2: collectives inside forward and backward").show()
viz.timeline(runs["tp=2 + sequence parallel"], steps=[STEPS - 1], title="tp=2 with sequence parallelism").show()
"""),
        md(
            "Step through the steps of the tp=2 run (the first step is slower: allocators and caches warm up):"
        ),
        code("""
from workbench.viz.widgets import timeline_explorer
timeline_explorer(runs["tp=2"])
"""),
        code("""
events = [e["args"] for e in runs["tp=2"].traces[0]["traceEvents"]
          if e.get("ph") == "X" and e.get("args", {}).get("group") == "tp" and e["args"].get("step") == STEPS - 1]
pd.DataFrame(events)[["layer", "direction", "op", "bytes"]]
"""),
        md("""
## Activation memory and communication against t, measured beside predicted

Activation bytes are counted from the tensors autograd saves (saved-tensor hooks) and predicted by
`workbench.predict.formulas.activation_bytes`, which counts what our block saves: 4·sbh values replicated on
every tp rank (layer-norm inputs and outputs, the residual), (4 + 2r)·sbh/t split (qkv, attention
output, MLP), a·s²·b/t attention probabilities. Sequence parallelism divides the replicated part by t too.
Communication per step, two ways. **Buffer bytes**: the size S of every tp collective's buffer, as nccl-tests
counts it, beside `formulas.tp_comm_bytes_per_step`. Buffer sizes of different collectives do not add up to
traffic: an all-reduce of S puts 2(t−1)/t·S on the wire from each rank (a reduce-scatter, then an all-gather),
a reduce-scatter or an all-gather (t−1)/t·S. So the **wire bytes** a rank sends — the buffer bytes times each
collective's factor (`trace/bandwidth.py`) — are what to compare across t and with sequence parallelism: they
grow with t, and sequence parallelism's reduce-scatter plus all-gather sends what one all-reduce sent (plus
the gather it repeats in backward), not twice as much.
"""),
        code("""
guess = viz.predict('tp = 2 and tp = 4 run the same all-reduces on buffers of the same size S. How many times tp = '
                    "2's wire bytes a step does a tp = 4 rank send?", unit='×')
guess
"""),
        code("""
from workbench.trace.bandwidth import bus_factor

def tp_bytes(by_op, t, wire):
    # buffer bytes (S) of the tp group's collectives, or the bytes each rank sends for them (S × the op's factor)
    return sum(g.get("tp", 0) * (bus_factor(op, t) if wire else 1) for op, g in by_op.items())

rows = []
for name, r in runs.items():
    s = r.summary["ranks"][0]
    c = r.config
    measured_comm = tp_bytes(s["comm_bytes_per_step"], c["tp"], wire=False)
    predicted_comm = tp_bytes(s["predicted_comm_bytes_per_step"], c["tp"], wire=False)
    rows.append({"run": name, "t": c["tp"], "sequence parallel": c["sequence_parallel"],
                 "parameters / rank": c["params_per_rank"],
                 "activation MB measured": s["peak_bytes"]["activation"] / 1e6,
                 "activation MB predicted": s["predicted_bytes"]["activation"] / 1e6,
                 "tp comm MB/step measured": measured_comm / 1e6,
                 "tp comm MB/step predicted": predicted_comm / 1e6,
                 "tp wire MB/step measured": tp_bytes(s["comm_bytes_per_step"], c["tp"], wire=True) / 1e6,
                 "tp wire MB/step predicted": tp_bytes(s["predicted_comm_bytes_per_step"], c["tp"], wire=True) / 1e6})
mem = pd.DataFrame(rows)
viz.check("activation memory measured = predicted", "abs(measured - predicted) < 1e-9",
          measured=mem["activation MB measured"], predicted=mem["activation MB predicted"])
viz.check("tensor-parallel buffer bytes per step measured = predicted", "abs(measured - predicted) < 1e-9",
          measured=mem["tp comm MB/step measured"], predicted=mem["tp comm MB/step predicted"])
viz.check("tensor-parallel wire bytes per step measured = predicted", "abs(measured - predicted) < 1e-9",
          measured=mem["tp wire MB/step measured"], predicted=mem["tp wire MB/step predicted"])
mem
"""),
        code("""
wire = mem.set_index("run")["tp wire MB/step measured"]
guess.reveal(wire["tp=4"] / wire["tp=2"],
             'An all-reduce sends 2(t−1)/t·S from each rank: 1·S at t = 2, 1.5·S at t = 4.')
"""),
        code("""
import plotly.express as px
long = mem.melt(id_vars=["run"], value_vars=["activation MB measured", "activation MB predicted"],
                var_name="source", value_name="MB")
px.bar(long, x="run", y="MB", color="source", barmode="group",
       labels={"MB": "activation memory per rank (MB)", "run": "run", "source": ""},
       title="activation memory per rank: measured beside predicted").show()
"""),
        md("""
For comparison, Megatron's 16-bit formula (with dropout masks, which our model does not have) per layer:
s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes.
"""),
        code("""
cfg = PRESETS["tiny"]
# both in 16 bits per value (2 bytes), as Megatron's formula counts; the runs above were fp32 (4 bytes)
pd.DataFrame([{"t": t, "ours, 16-bit (bytes/layer)": formulas.activation_bytes_per_layer(cfg, 16, 2, tp=t),
               "ours with SP, 16-bit": formulas.activation_bytes_per_layer(cfg, 16, 2, tp=t, sequence_parallel=True),
               "Korthikanti et al., 16-bit": formulas.korthikanti_activation_bytes_per_layer(cfg, 16, t)}
              for t in (1, 2, 4)])
"""),
        md("""
## Memory per rank

Parameters, gradients and Adam's moments shrink with t (the replicated layer norms, position embeddings
and row biases stay whole on every rank).
"""),
        code("""
viz.memory_breakdown(runs["dp=2 × tp=2"]).show()
"""),
    ],
    "02_tensor_parallel.ipynb",
)
