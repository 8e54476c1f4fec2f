"""Regenerates notebooks/05_3d_parallel.ipynb (outputs stripped). Edit here, then run it."""
from notebook_cells import code, md, write

write([
md("""
# 5 · 3D parallelism: data × tensor × pipeline on 8 ranks

The brief's 3D picture: **tensor parallelism innermost** (the ranks that exchange activations inside
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
from workbench.grid import RankGrid

grid = RankGrid(dp=2, tp=2, pp=2)
rows = []
for r in range(grid.world_size):
    c = grid.coords(r)
    rows.append({"rank": r, **c, "tp group": grid.group_ranks("tp", r), "dp group": grid.group_ranks("dp", r),
                 "pp group": grid.group_ranks("pp", r)})
pd.DataFrame(rows).set_index("rank")
"""),
code("""
layout = pd.DataFrame([{"rank": r, "pipeline stage": f"pp {c['pp']}", "data replica": f"dp {c['dp']}",
                        "tensor shard": c["tp"]} for r, c in ((r, grid.coords(r)) for r in range(8))])
fig = px.scatter(layout, x="tensor shard", y="data replica", facet_col="pipeline stage", text="rank",
                 title="which ranks share which group: a row is a tp group, a column a dp group, "
                       "the same cell across stages a pp group")
fig.update_traces(marker_size=40, textfont_color="white")
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
assert (losses.max_abs_diff <= 1e-5 * losses.final_loss).all(), losses
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
code("""
viz.memory_breakdown(three_d).show()
"""),
], "05_3d_parallel.ipynb")
