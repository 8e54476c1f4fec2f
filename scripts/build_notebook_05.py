"""Regenerates notebooks/05_3d_parallel.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 5 · 3D parallelism: data × tensor × pipeline on 8 ranks

The standard 3D picture (Megatron-LM's): **tensor parallelism innermost** (the ranks that exchange activations inside
every layer sit next to each other — on one machine, on NVLink), then **data parallelism**, and
**pipeline parallelism outermost** (only activations at stage boundaries cross it, so it tolerates the
slowest links). Megatron-LM's order:

    rank = pp_index · (dp · tp) + dp_index · tp + tp_index
"""),
        code("""
import os
import pandas as pd
import plotly.express as px
import workbench as wb
from workbench import viz
from workbench.config.grid import RankGrid

grid = RankGrid(dp=2, tp=2, pp=2)
rows = []
for r in range(grid.world_size):
    c = grid.coords(r)
    rows.append({"rank": r, **c, "tp group": grid.group_ranks("tp", r), "dp group": grid.group_ranks("dp", r),
                 "pp group": grid.group_ranks("pp", r)})
pd.DataFrame(rows).set_index("rank")
"""),
        code("""
layout = pd.DataFrame([{"rank": r, "pipeline stage": f"stage {c['pp']}", "data replica": f"replica {c['dp']}",
                        "tensor shard": c["tp"], "tp group": f"tp group {grid.group_ranks('tp', r)}"}
                       for r, c in ((r, grid.coords(r)) for r in range(8))])
fig = px.scatter(layout, x="tensor shard", y="data replica", facet_col="pipeline stage", text="rank",
                 color="tp group", title="a row is a tp group (one colour each), a column a dp group, "
                                         "the same cell across stages a pp group")
fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))   # "stage 0", not "pipeline stage=stage 0"
fig.update_traces(marker_size=40, textfont_color="white")
fig.update_xaxes(dtick=1, range=[-0.6, 1.6])
fig.update_layout(height=380, legend_title_text="")
fig.show()
"""),
        md("""
## The same model, split four ways

A 4-layer model with 8 heads (so that t = 8 divides them), global batch 16: all tensor-parallel on 8
ranks, pipeline × data on 8, and the 3D layout on 8 — every run must equal the single process step by
step. (Pure data parallelism and ZeRO are notebooks 01 and 04.)
"""),
        code("""
OUT = os.path.join("..", "traces", "nb05")
STEPS = 4
model = wb.ModelConfig(hidden=64, heads=8, layers=4)

def run(name, **config):
    return wb.launch(wb.RunConfig(model=model, steps=STEPS, global_batch=16, seed=0, **config),
                     out=os.path.join(OUT, name), force=True)

runs = {
    "1 process": run("single"),
    "TP: tp=8": run("tp8", tp=8),
    "PP: pp=4 × dp=2": run("pp4dp2", pp=4, dp=2, microbatches=4),
    "3D: dp=2 × tp=2 × pp=2": run("3d", dp=2, tp=2, pp=2, microbatches=2),
}
losses = viz.compare_losses(runs, baseline="1 process")
viz.check("every layout's losses equal one process's within 1e-5 × loss",
          "difference <= 1e-5 * loss", difference=losses.max_abs_diff, loss=losses.final_loss)
losses
"""),
        md("## What each rank holds, and what each one sends"),
        code("""
rows = []
for name, r in runs.items():
    s0 = r.summary["ranks"][0]
    states = sum(s0["peak_bytes"][k] for k in ("parameter", "gradient", "optimizer_state"))
    sent = s0["comm_bytes_per_step"]
    rows.append({"run": name, "model states MB (rank 0)": states / 1e6,
                 "activation MB (rank 0)": s0["peak_bytes"]["activation"] / 1e6,
                 "bytes sent per step (rank 0)": s0["bytes_moved_per_step"],
                 "collectives": ", ".join(f"{op} {'/'.join(g)}" for op, g in sent.items())})
pd.DataFrame(rows)
"""),
        code("""
three_d = runs["3D: dp=2 × tp=2 × pp=2"]
viz.timeline(three_d, steps=[STEPS - 1], ranks=[0, 1, 4, 5],
             title="3D: ranks 0, 1 (stage 0, one tp pair) and 4, 5 (stage 1)").show()
"""),
        md("Step through the 3D run's steps, all eight ranks:"),
        code("""
from workbench.viz.widgets import timeline_explorer
timeline_explorer(three_d)
"""),
        code("""
viz.memory_breakdown(three_d).show()
"""),
        md("""
## Where each axis goes: the placement rule, measured

The rule above — tensor parallelism inside a machine, the pipeline across machines — follows from the bytes
each axis sends. Measure it: 4 ranks as 2 emulated machines of 2 (`ranks_per_node=2`), tp = 2 × pp = 2, joined
by a slow link (20 MB/s, 500 µs; free inside a machine). Two placements of the same grid:

- **block** (torchrun numbers each machine's ranks consecutively): each tp pair on one machine, the pipeline
  across the link;
- **round-robin** (rank r on machine r mod 2, as a grid laid out in the wrong order would be): each tp pair
  across the link, the pipeline inside.

The bytes are measured from each rank's trace; the link's time is the emulator's hold, latency + bytes /
bandwidth (a teaching device: a real wire is the cluster notebook's), and the step time is the clock's.
"""),
        code("""
LINK = "inter=0.02,500"   # GB/s, µs between the two emulated machines; inside a machine: loopback, free
PLACED_STEPS = 12

def placed(name, placement=None):
    link = {} if placement is None else dict(emulate_link=LINK, ranks_per_node=2, node_placement=placement)
    return wb.launch(wb.RunConfig(model=model, steps=PLACED_STEPS, global_batch=16, seed=0, tp=2, pp=2,
                                  microbatches=4, **link), out=os.path.join(OUT, name), force=True)

placements = {"no slow link": placed("place-none"), "block: tp inside, pp across": placed("place-block", "block"),
              "round-robin: tp across, pp inside": placed("place-rr", "round-robin")}
losses = viz.compare_losses(placements, baseline="no slow link")
viz.check("the placement changes no loss", "difference == 0", difference=losses.max_abs_diff)
base = placements["no slow link"].summary["step_time_s"]
M, P = 4, 2
rows = []
for name, r in placements.items():
    sent, ev = r.summary["ranks"][0]["comm_bytes_per_step"], r.events
    held = ev[ev.cat == "emulated"].groupby("rank").seconds.sum().reindex(range(4), fill_value=0) / PLACED_STEPS
    steps = r.metrics.step_time_s.iloc[1:]          # the first step pays the start-up
    rows.append({"placement": name, "tp bytes/step (rank 0)": sent["all_reduce"]["tp"],
                 "pp bytes sent/step (rank 0)": sent["send"]["pp"],
                 "hold ms/step, stage 0 (formula)": 1e3 * held[0], "hold ms/step, stage 1 (formula)": 1e3 * held[2],
                 "step ms": 1e3 * r.summary["step_time_s"],
                 "± ms (half the steps' interquartile range)": 500 * (steps.quantile(0.75) - steps.quantile(0.25)),
                 "added by the link ms": 1e3 * (r.summary["step_time_s"] - base)})
place = pd.DataFrame(rows).set_index("placement")
# each micro-batch's slot on a stage grows by the stage's hold / m, and a 1F1B step spans m + p − 1 slots
place["predicted added ms"] = (M + P - 1) / M * place[["hold ms/step, stage 0 (formula)",
                                                       "hold ms/step, stage 1 (formula)"]].max(axis=1)
error = (place["predicted added ms"] - place["added by the link ms"]) / place["added by the link ms"].abs()
place["error"] = ["—"] + [f"{e:+.0%}" for e in error.iloc[1:]]   # the baseline has nothing to predict
tp_bytes, pp_bytes = place["tp bytes/step (rank 0)"].iloc[0], place["pp bytes sent/step (rank 0)"].iloc[0]
block_ms, rr_ms = place["step ms"].iloc[1], place["step ms"].iloc[2]
viz.check("tensor parallelism sends at least 5× the pipeline's bytes a step", "tp_bytes >= 5 * pp_bytes",
          tp_bytes=tp_bytes, pp_bytes=pp_bytes)
viz.check("the same grid steps slower with tp across the slow link than with pp across it", "rr_ms > block_ms",
          rr_ms=rr_ms, block_ms=block_ms, margin=viz.headroom(block_ms, rr_ms),
          regime="tp 2 × pp 2 on 2 cores as 2 emulated machines, hidden 64, 20 MB/s and 500 µs between them",
          timing="step times of runs on shared cores (the link's holds are the emulator's formula)")
noise = place.loc["no slow link", "± ms (half the steps' interquartile range)"]
for name in list(placements)[1:]:
    row = place.loc[name]
    miss = abs(row["predicted added ms"] - row["added by the link ms"])
    hold = max(row["hold ms/step, stage 0 (formula)"], row["hold ms/step, stage 1 (formula)"])
    cause = ("" if abs(error[name]) <= 0.25 else
             f": the run with the link stepped faster than the one without, so the difference of two runs on shared "
             f"cores is larger here than the link's {hold:.1f} ms hold" if row["added by the link ms"] < 0 else
             f": a miss of {miss:.1f} ms, within this machine's step-to-step spread (±{noise:.1f} ms with no link, "
             "twice that for a difference of two runs)" if miss <= 2 * noise else
             f": a miss of {miss:.1f} ms, beyond the steps' spread (±{noise:.1f} ms) and not explained by the slots")
    print(f"{name}: predicted {row['predicted added ms']:.1f} ms added, measured {row['added by the link ms']:.1f} ms "
          f"({error[name]:+.0%}){cause}")
place.T.round(2)
"""),
        md("""
Tensor parallelism all-reduces activations inside every layer, forward and backward, and a rank waits for
each before the next matmul: across the slow link every one of them pays the latency and the bandwidth, on
the critical path. The pipeline sends one activation a micro-batch at a stage boundary. So the same grid, with
the same losses, pays more for the link with its tensor-parallel pairs split across it: compare the two rows'
holds and step times above. The prediction puts each stage's hold into the pipeline's step: every micro-batch's
slot on the stage grows by hold / m, and a 1F1B step spans m + p − 1 slots.
"""),
        md("""
## The same layout at GPT-3's scale: per GPU

The eight tiny ranks above show the mechanics. What the layout does at scale is arithmetic: GPT-3 175B
on 96 DGX A100 machines (768 GPUs) with Megatron-LM's layout — tensor parallelism 8 inside each
machine, 12 pipeline stages, 8 data-parallel replicas — bf16 with fp32 main gradients, selective
recomputation, sequence parallelism, 1,536 sequences of 2,048 tokens per step in micro-batches of one.
The estimator (docs/formulas.md) gives what each GPU holds and what crosses each kind of link.
"""),
        code("""
from workbench.predict.estimator import A100_80GB, GPT3_175B

big = wb.RunConfig(model=GPT3_175B, tp=8, pp=12, dp=8, global_batch=1536, microbatches=192, precision="bf16",
                   recompute="selective", sequence_parallel=True)
e = wb.estimate(big, hardware=A100_80GB)
per_gpu = pd.Series({**{f"{k} (model state)": v for k, v in e.model_state_bytes.items()},
                     "activations": e.activation_bytes_per_rank}, name="GB per GPU") / 1e9
layers_share = e.params / 96 * 18 / 1e9   # 1/(tp·pp) of every parameter, at 18 bytes each
print(f"Ψ = {e.params / 1e9:.1f} B; one GPU holds 1/(tp·pp) = 1/96 of the model: {e.params / 96 / 1e9:.2f} B "
      f"parameters × 18 bytes = {layers_share:.1f} GB; stage 0's GPUs also hold the word and position embeddings' "
      f"shard (V·h/t + s·h values), so their model states come to {per_gpu.iloc[:3].sum():.1f} GB "
      f"(+{per_gpu.iloc[:3].sum() - layers_share:.1f} GB)")
per_gpu.round(2).to_frame().assign(share=lambda d: (d["GB per GPU"] / d["GB per GPU"].sum()).round(2))
"""),
        code("""
LINKS = {"tp": ("NVLink, inside a machine", A100_80GB.intra_node_bw),
         "pp": ("InfiniBand, between machines", A100_80GB.inter_node_bw),
         "dp": ("InfiniBand, between machines", A100_80GB.inter_node_bw)}
links = pd.DataFrame([{"group": g, "link": LINKS[g][0], "GB sent per GPU per step": b / 1e9,
                       "link GB/s": LINKS[g][1] / 1e9, "seconds at full speed": b / LINKS[g][1]}
                      for g, b in e.comm_bytes_per_step.items()]).set_index("group")
mfu = e.flops_per_step / (e.step_time_s * big.world_size * A100_80GB.peak_flops)
print(f"estimated step {e.step_time_s:.1f} s: compute {e.step_terms['compute']:.1f} s, tensor-parallel "
      f"{e.step_terms['tp']:.1f} s, pipeline {e.step_terms['pipeline']:.1f} s (bubble {e.bubble_fraction:.1%}), "
      f"exposed DP {e.step_terms['dp']:.2f} s; MFU = {mfu:.0%} of the A100s' 312 TFLOP/s")
links.round(2)
"""),
        md("""
Tensor parallelism moves by far the most bytes — hundreds of gigabytes per GPU per step, activations in
every layer — which is why it stays on NVLink (230 GB/s here, ten times a 25 GB/s InfiniBand port).
Pipeline parallelism sends only micro-batch activations at the 11 stage boundaries; data parallelism
all-reduces the gradients of 1/96 of the model once per step, overlapped with the last micro-batches'
backward. Both cross machines, on InfiniBand.

**Which published figure this MFU is comparable with.** MFU counts the model's FLOPs only (6·Ψ·tokens and the
attention's), never a recomputed forward. Korthikanti et al. 2022 train this way — selective recomputation with
sequence parallelism, as here — and report **54.2 % MFU** for a 530B GPT on 2,240 A100s (42.1 % with full
recomputation). Narayanan et al. 2021's often-quoted 44–52 % of peak for GPT-3-like models counts the forward
that full recomputation runs again: it is closer to hardware FLOPs utilisation, so it is not this figure's peer.

**The same layout in notebook 07.** The planner there shows GPT-3 on this layout with other memory a GPU. The
configurations differ, not the arithmetic: the planner's setting is mixed precision with 16-bit gradients (16Ψ,
no fp32 main gradients) and no sequence parallelism, so each tensor-parallel rank keeps the layer norms'
activations whole (4·sbh a layer, replicated on all 8 ranks). Both, from the same estimator:
"""),
        code("""
planner_layout = wb.RunLayout(model=GPT3_175B, tp=8, pp=12, dp=8, global_batch=1536, microbatches=192,
                              precision="mixed", recompute="selective")
planner_setting = wb.estimate(planner_layout, activations="megatron", hardware=A100_80GB)
both = {"here: bf16 + fp32 main gradients, sequence parallel": e,
        "notebook 07's planner: mixed, 16-bit gradients, no sequence parallel": planner_setting}
pd.DataFrame({name: {"model states GB": sum(x.model_state_bytes.values()) / 1e9,
                     "activations GB": x.activation_bytes_per_rank / 1e9} for name, x in both.items()}).T.round(1)
"""),
        md("""
## How many GPUs GPT-3 needs, before one activation

"175 billion parameters need about 350 GB" is often said of GPT-3. That is its **fp16 weights alone** (2 bytes a
parameter). Training also keeps the gradients, Adam's two moments and an fp32 master copy: ZeRO's 16 bytes a
parameter of model states in mixed precision (16Ψ; 18Ψ with fp32 main gradients, as above).
"""),
        code("""
guess = viz.predict('GPT-3 has 175 B parameters. With Adam in mixed precision (16 bytes a parameter of model states),'
                    ' how many A100-80GB does it need at the least, before one activation?', unit=' GPUs')
guess
"""),
        code("""
import math

psi = GPT3_175B.param_count()
accounts = {"fp16 weights alone (2Ψ)": 2 * psi, "model states, 16Ψ": 16 * psi, "model states, 18Ψ": 18 * psi}
print(f"Ψ = {psi / 1e9:.0f} B parameters")
pd.DataFrame([{"what": k, "TB": v / 1e12, "A100-80GB at the least": math.ceil(v / 80e9)} for k, v in accounts.items()])
"""),
        code("""
guess.reveal(math.ceil(16 * psi / 80e9),
             '16 × 175 B = 2.8 TB of model states; the 350 GB often quoted is the fp16 weights alone.')
"""),
    ],
    "05_3d_parallel.ipynb",
)
