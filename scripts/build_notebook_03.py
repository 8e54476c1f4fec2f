"""Regenerates notebooks/03_pipeline_parallel.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 3 · Pipeline parallelism: GPipe, 1F1B, interleaved 1F1B, zero bubble

The model's layers are cut into **stages**, one per rank (or v per rank, interleaved). A batch is cut
into **m microbatches** that flow through the stages; activations go forward and their gradients come
back by point-to-point send/receive. While the pipeline fills and drains, ranks wait: the **bubble**,
(p − 1)/(m + p − 1) of the step with equal stage times — smaller with more microbatches. Interleaving
with v chunks per rank makes the bubble's *time* v times shorter; its *fraction* of the step becomes
(p − 1)/(v·m + p − 1), not v times smaller (p = 4, m = 8: 27 % → 16 % with v = 2, not 14 %).

Schedules here are **data**: each rank's list of actions (`0F3` = stage 0 forward of microbatch 3,
`SEND_F`, `RECV_B` ...). The same list is validated (no backward before its forward, every send
received, no deadlock), simulated without processes, drawn, and executed.
"""),
        code("""
import os
import pandas as pd
import workbench as wb
from workbench import viz
from workbench.predict import formulas
from workbench.schedules.build import build_schedule, validate, simulate, peak_in_flight, peak_pending_w
from workbench.viz.pipeline import bubble_explorer

s = build_schedule("1f1b", p=4, m=8)
print(s.grid())
viz.check("the schedule passes the validator", "problems == 0", problems=len(validate(s)));
"""),
        md("""
## Planned: the simulator

Equal forward costs, backward twice as long. Move the sliders: with free transfers the bubble follows
the formula exactly. `t_comm / t_f` gives each activation transfer between stages a cost: every
micro-batch crosses p−1 boundaries on the way in and out, on the critical path, and the bubble grows
beyond the formula. The rank labels carry the most micro-batches whose activations each rank holds at
once — GPipe holds all m, 1F1B at most p (rank 0 the most). The zero-bubble schedules (`zbh1`, `zbv`,
below) split each backward into I and W; `T_W / T_B` sets how much of a backward is W.
"""),
        code("""
bubble_explorer()
"""),
        code("""
rows = []
for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
    for m in (4, 8, 16):
        sched = build_schedule(name, 4, m, v)
        rows.append({"schedule": name, "p": 4, "m": m, "v": v,
                     "simulated bubble": simulate(sched).bubble_fraction(),
                     "formula": formulas.bubble_fraction(4, m, v),
                     "peak in-flight microbatches (rank 0)": peak_in_flight(sched)[0]})
table = pd.DataFrame(rows)
viz.check("the simulated bubble equals (p−1)/(m+p−1) at unit costs", "abs(simulated - formula) < 1e-12",
          simulated=table["simulated bubble"], formula=table["formula"])
table
"""),
        md("""
GPipe keeps all m microbatches' activations on every stage; 1F1B starts backward as soon as it can
and holds at most p on the first stage — same bubble, far less memory. Interleaving cuts the bubble by v
at the price of more, smaller transfers.

## Why the transfers are posted in batches: NCCL's rule

On gloo a send never blocks: the data is copied out. On NCCL a large send (above its few-MB eager
buffer) waits until the matching receive is posted, and a rank's transfers to a peer run in order on
one stream. Post each transfer on its own, right where it is needed, and 1F1B's steady state deadlocks:
rank 0's "send F1" waits for rank 1's "receive F1", queued behind rank 1's "send B0", which waits for
rank 0's "receive B0", queued behind "send F1". So the executor posts each round's transfers together,
in lockstep with its neighbours — one `batch_isend_irecv` (one NCCL group) — as Megatron-LM and torch's
pipelining do. The validator checks that rule (and that both ranks of a pair post their transfers in the
same order, since NCCL has no tags):
"""),
        code("""
old = build_schedule("1f1b", p=2, m=4, placement="adjacent")   # each receive just before, each send just after
print("posted one by one, gloo's rule:", validate(old, rule="gloo", batched=False) or "no deadlock")
print("posted one by one, NCCL's rule:", validate(old, batched=False)[0][:160], "…")
print("batched in lockstep, NCCL's rule:", validate(build_schedule("1f1b", p=2, m=4)) or "no deadlock")
viz.check("the old order passes gloo's rule and fails NCCL's", "gloo_problems == 0 and nccl_problems > 0",
          gloo_problems=len(validate(old, rule="gloo", batched=False)), nccl_problems=len(validate(old, batched=False)))
for item in build_schedule("1f1b", p=2, m=4).program(0):
    print(item)
"""),
        md("""
## Measured: real runs on this machine

A 4-layer model, global batch 16, each schedule on 2 ranks; all must equal one process. *Predict
first:* with p = 2 and m = 4, what bubble fraction does the formula give for GPipe and 1F1B, and which
one holds fewer activations on rank 0? Then compare with the measurement below.
"""),
        code("""
OUT = os.path.join("..", "traces", "nb03")
STEPS = 5
model = wb.ModelConfig(layers=4)

def run(name, **config):
    return wb.launch(wb.RunConfig(model=model, steps=STEPS, global_batch=16, seed=0, **config),
                     out=os.path.join(OUT, name), force=True)

runs = {
    "1 process": run("single"),
    "GPipe p=2 m=4": run("gpipe", pp=2, schedule="gpipe", microbatches=4),
    "1F1B p=2 m=4": run("1f1b", pp=2, schedule="1f1b", microbatches=4),
    "interleaved p=2 v=2 m=4": run("interleaved", pp=2, schedule="interleaved", virtual_stages=2, microbatches=4),
    "dp=2 × pp=2": run("dp2pp2", dp=2, pp=2, microbatches=2, bucket_mb=0.02),
}
losses = viz.compare_losses(runs, baseline="1 process")
viz.check("every schedule's losses equal one process's within 1e-5 × loss",
          "difference <= 1e-5 * loss", difference=losses.max_abs_diff, loss=losses.final_loss)
losses
"""),
        md("""
Planned (the schedule simulated with the forward and backward times the run measured) above, what the
ranks recorded below. Forward solid, backward hatched, one colour per microbatch, grey where a rank waits.
"""),
        code("""
viz.planned_vs_measured(runs["1F1B p=2 m=4"]).show()
viz.planned_vs_measured(runs["GPipe p=2 m=4"]).show()
viz.planned_vs_measured(runs["interleaved p=2 v=2 m=4"]).show()
"""),
        md("""
Three bubbles stand in each chart, and they differ for reasons you can name:

- **the formula** (p−1)/(v·m+p−1) assumes every forward takes the same time, every backward the same time,
  and communication is free;
- **planned** simulates the schedule with the forward and backward times this run *measured* (their
  means): it keeps the schedule's dependencies and the real ratio t_b/t_f, so it moves away from the
  formula when backward is not twice forward;
- **measured** is what the ranks recorded. Each microbatch boundary is a gloo send/recv (a few hundred
  µs on this CPU) on the critical path, and on a tiny model that is as long as the compute itself; the
  actions are uneven (the first stage embeds, the last computes the loss), and the two ranks share two
  cores with gloo's threads. Interleaving multiplies the boundaries by v — so here its measured bubble is
  far above its formula, the opposite of what it buys on a GPU, where a microbatch's compute dwarfs the
  p2p latency.
"""),
        md("""
## Activation memory per stage: GPipe holds m, 1F1B at most p

Measured peaks (saved-tensor hooks) beside the schedule's prediction: walk each rank's action list,
adding one microbatch's stage activations at each forward and releasing them at its backward.
"""),
        code("""
rows = []
for name in ("GPipe p=2 m=4", "1F1B p=2 m=4", "interleaved p=2 v=2 m=4"):
    for r in runs[name].summary["ranks"]:
        rows.append({"run": name, "rank": r["rank"], "activation MB measured": r["peak_bytes"]["activation"] / 1e6,
                     "predicted": r["predicted_bytes"]["activation"] / 1e6})
mem = pd.DataFrame(rows)
viz.check("activation memory measured = predicted", "abs(measured - predicted) < 1e-9",
          measured=mem["activation MB measured"], predicted=mem["predicted"])
mem
"""),
        md("""
## Zero bubble: split the backward in two (Qi et al., ICLR 2024)

A backward computes two things: the gradient of the stage's **input** (I), which the previous stage is
waiting for, and the gradients of its **weights** (W), which nobody waits for — they are only needed
at the optimizer step. For a Linear y = x·Wᵀ, I is dx = dy·W and W is dW = dyᵀ·x: so I keeps x and dy
(the "stash") and W can run *later*, in what would have been a bubble.

- **ZB-H1**: 1F1B's order and activation memory, W deferred into the cool-down. Bubble rate (idle ÷ work
  at T_F = T_I = T_W) (p − 1)/3m: a third of 1F1B's (p − 1)/m.
- **ZBV**: two stages per rank in a V (rank r holds stages r and 2p − 1 − r, so the first stage and the
  loss are both on rank 0): with W filling the gaps the bubble rate is **0** — only the start-up stagger
  remains, which a step without an optimizer synchronisation would overlap with the next.

*Predict first:* with p = 4 and m = 8, what bubble rate does each schedule have, and which holds the most
activations on rank 0?
"""),
        code("""
rows, paper = [], {}
for name, v in (("1f1b", 1), ("interleaved", 2), ("zbh1", 1), ("zbv", 2)):
    sched = build_schedule(name, 4, 8, v)
    paper[name] = formulas.bubble_rate(name, 4, 8, v)
    t = simulate(sched, t_f=1.0, t_b=2.0, t_w=1.0)
    rows.append({"schedule": name, "bubble rate (simulated)": t.bubble_rate(),
                 "paper": f"{formulas.RATES[name]} = {paper[name]:.3f}",
                 "bubble fraction of the step": t.bubble_fraction(),
                 "activations in flight, rank 0 (stage-sized)": peak_in_flight(sched)[0] / sched.v,
                 "W stashes held, rank 0": peak_pending_w(sched)[0], "valid": validate(sched) == []})
zb_table = pd.DataFrame(rows)
viz.check("the simulated bubble rates are the paper's at T_F = T_I = T_W",
          "abs(simulated - paper) < 1e-12", simulated=[r["bubble rate (simulated)"] for r in rows],
          paper=[paper[r["schedule"]] for r in rows])
print(build_schedule("zbh1", 4, 8).grid())
zb_table
"""),
        md("""
Where did each W go? The schedule at T_F = T_I = T_W, each W joined to its I by a line: the later stages
(which finish their forwards first) push their W's furthest — into the cool-down where 1F1B idles. The
first stage never defers: an I followed at once by its own W is simply B (one autograd pass, nothing
stashed), as torch's schedules merge them too. In
the explorer above, move `T_W / T_B` away from ½: with W shorter than I there is less to fill the gaps
with, with W longer it overflows them, and ZBV's bubble stops being zero on both sides.
"""),
        code("""
viz.w_deferral(build_schedule("zbh1", 4, 8)).show()
viz.w_deferral(build_schedule("zbv", 4, 8)).show()
"""),
        md("""
### Measured: ZB-H1 and ZBV on 2 ranks

Each Linear's weight gradient is now computed later, from the stash, and added into the same buffers: the
model must still train exactly like one process. The regime matters here. With the 4-layer tiny model above,
a micro-batch's forward is as short as the Python and the gloo transfer around it, so the bubble is mostly
latency and deferring W has nothing to fill: measured there, ZB-H1 and ZBV idled *more* than 1F1B. So these
runs use the `small` model (4 layers of hidden 256, global batch 32), where a pass is tens of milliseconds of
arithmetic, as a GPU's is against its kernel launches.
"""),
        code("""
guess = viz.predict("At p = 2 and m = 4 the formula gives 1F1B a bubble of 1/5 of the step, ZB-H1 a third of 1F1B's "
                    'rate. On this machine, with the small model, what bubble fraction will ZB-H1 measure?', unit='')
guess
"""),
        code("""
def run_small(name, **config):
    return wb.launch(wb.RunConfig(model="small", steps=STEPS, global_batch=32, seed=0, **config),
                     out=os.path.join(OUT, name), force=True)

zb_runs = {"1 process": run_small("small-single"),
           "1F1B p=2 m=4": run_small("small-1f1b", pp=2, schedule="1f1b", microbatches=4),
           "interleaved p=2 v=2 m=4": run_small("small-interleaved", pp=2, schedule="interleaved", virtual_stages=2,
                                                microbatches=4),
           "ZB-H1 p=2 m=4": run_small("small-zbh1", pp=2, schedule="zbh1", microbatches=4),
           "ZBV p=2 m=4": run_small("small-zbv", pp=2, schedule="zbv", microbatches=4)}
zb_losses = viz.compare_losses(zb_runs, baseline="1 process")
viz.check("ZB-H1 and ZBV equal one process within 1e-5 × loss",
          "difference <= 1e-5 * loss", difference=zb_losses.max_abs_diff, loss=zb_losses.final_loss)
zb_runs.pop("1 process")
bubbles = {k: r.summary["bubble_fraction"]["measured"] for k, r in zb_runs.items()}
viz.check("with real work per micro-batch, ZB-H1 idles less than 1F1B",
          "zbh1 < one_f_one_b", zbh1=bubbles["ZB-H1 p=2 m=4"],
          one_f_one_b=bubbles["1F1B p=2 m=4"],
          margin=viz.headroom(bubbles["ZB-H1 p=2 m=4"], bubbles["1F1B p=2 m=4"]),
          regime="pp 2 on 2 cores, small, m 4",
          timing="bubbles measured in two runs on shared cores")
viz.schedules_side_by_side(zb_runs)
"""),
        code("""
split = {k.replace("_", " "): v for k, v in zb_runs["ZB-H1 p=2 m=4"].summary["bubble_fraction"]["split"].items()
         if k not in ("measured", "formula")}
guess.reveal(bubbles["ZB-H1 p=2 m=4"],
             "Above the formula's rate, the run's own split of the gap (each part measured from its trace): "
             + ", ".join(f"{k} {v:+.3f}" for k, v in split.items()) + ".")
"""),
        md("""
Planned beside measured: the plan uses the mean time each kind of action (F, I, W) took here.
"""),
        code("""
viz.planned_vs_measured(zb_runs["ZB-H1 p=2 m=4"]).show()
viz.planned_vs_measured(zb_runs["ZBV p=2 m=4"]).show()
"""),
        md("""
What deferring W costs: from each I until its W, every Linear keeps its input and its output gradient
(16·h values per token and layer at t = 1, plus the head's h + V on the last stage). The memory counter
records it as its own category, `wgrad_stash`, beside the activations — measured here, equal to the
formula (the schedule walked with those bytes per microbatch).
"""),
        code("""
viz.stash_over_time({k: zb_runs[k] for k in ("1F1B p=2 m=4", "ZB-H1 p=2 m=4", "ZBV p=2 m=4")}).show()
stash = pd.DataFrame([{"run": k, "rank": r["rank"], "W stash MB measured": r["peak_bytes"]["wgrad_stash"] / 1e6,
                       "predicted": r["predicted_bytes"]["wgrad_stash"] / 1e6}
                      for k in ("ZB-H1 p=2 m=4", "ZBV p=2 m=4") for r in zb_runs[k].summary["ranks"]])
viz.check("the W stash measured = predicted", "abs(measured - predicted) < 1e-9",
          measured=stash["W stash MB measured"], predicted=stash["predicted"])
stash
"""),
        md("""
### The same schedule in torch

torch.distributed.pipelining reads and writes schedules as CSV (`_PipelineScheduleRuntime._load_csv`,
format `compute_only`; torchtitan's `pipeline_parallel_schedule_csv`): one row per rank, one cell per
action, `stage` + kind + `microbatch` (`0F3`, `1I2`, `1W2`, `0B0`). `workbench schedule export --format
torch-csv` writes ours, and `--schedule csv:FILE` runs any of theirs (tests/test_zero_bubble.py runs our
ZB-H1 on torch's runtime, and torch's DualPipeV on ours). Below: our action grid, and the same CSV as
torch's visualizer spaces it (`_schedule_visualizer.add_schedule_op_spacing`: one column per time step).
"""),
        code("""
from workbench.schedules.torch_csv import write_csv

zbh1 = build_schedule("zbh1", 2, 4)
write_csv(zbh1, os.path.join(OUT, "zbh1.csv"))
print(open(os.path.join(OUT, "zbh1.csv")).read())
viz.torch_grid(zbh1)
"""),
        md("""
## The bubble against m, measured beside the formula

Here the stages need real work for the bubble to be about compute, not latency: the `small` model
(4 layers of hidden 256), global batch 32. The formula assumes equal stage times and free
communication. The measured bubble differs from it (the error column), and the run's summary splits the gap
into measured parts (`bubble_fraction.split`, each read from the trace): **uneven stages** — the last stage
also runs the head and the loss, so it is slower, and the first waits for it (Megatron-LM lets you give the first
and last stages fewer layers with `--decoder-first-pipeline-num-layers` for that reason) — the **host gaps**
between actions (Python between two micro-batches), the **transfers**, and what none of them explains (the
noise of four steps on shared cores). The line under the table names the largest part at each m.
"""),
        code("""
bubble_runs = [wb.launch(wb.RunConfig(model="small", pp=2, microbatches=m, global_batch=32, steps=4),
                         out=os.path.join(OUT, f"bubble-m{m}"), force=True) for m in (2, 4, 8)]
rows = []
for r in bubble_runs:
    b = r.summary["bubble_fraction"]
    rows.append({"m": r.config["microbatches"], "measured": b["split"]["measured"], "formula": b["predicted"],
                 "error %": 100 * (b["predicted"] / b["split"]["measured"] - 1),
                 **{f"+ {k.replace('_', ' ')}": v for k, v in b["split"].items() if k not in ("measured", "formula")}})
parts = pd.DataFrame(rows).set_index("m")
print("the largest part of each gap: " + "; ".join(
    f"m = {m}: {row.filter(like='+ ').abs().idxmax()[2:]} ({row.filter(like='+ ').abs().max():.3f})"
    for m, row in parts.iterrows()))
parts.round(3)
"""),
        code("""
viz.bubble_vs_m(bubble_runs).show()
"""),
        md("""
Every send is linked to its receive in the trace (`trace.json`, flows between the ranks' lanes), and
each action is a span on the `schedule` lane — open it in <https://ui.perfetto.dev>.
"""),
        code("""
ev = runs["1F1B p=2 m=4"].events
ev[(ev.lane == "schedule") & (ev.step == STEPS - 1) & (ev["rank"] == 0)][["name", "start_us", "dur_us"]].head(12)
"""),
    ],
    "03_pipeline_parallel.ipynb",
)
