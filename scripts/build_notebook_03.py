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
small_single = zb_runs.pop("1 process")
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
## DualPipe and DualPipeV: micro-batches from both ends (DeepSeek-V3, 2024)

DeepSeek-V3's pipeline (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1) feeds micro-batches in
from **both ends at once**. **DualPipe** keeps two copies of the model on P ranks: rank r holds stage r of the
copy the first half of the micro-batches goes *down*, and stage P − 1 − r of the copy the second half comes
*up*. In the steady state a rank issues one micro-batch's forward together with another's backward, an
**F&B pair**: on a GPU the two overlap, each computing while the other communicates (an expert-parallel
all-to-all, a pipeline send). The last backwards leave their weight gradients (W) for the tail, as ZB-H1
and ZBV do. **DualPipeV** (Sea AI Lab's "cut-in-half") folds it into a V over one copy: P ranks, 2P stages,
rank r holding stages r and 2P − 1 − r — ZBV's placement.

The deepseek-ai/DualPipe README compares them "based on the same number of PP stages" (PP: pipeline
stages; F, B, W one stage's forward, full backward and weight pass; F&B an overlapped pair):

| | bubble (idle per rank over a step) | parameters per rank | activations per rank | ranks |
|---|---|---|---|---|
| 1F1B | (PP − 1)(F + B) | 1× | PP | PP |
| ZB1P (our ZB-H1) | (PP − 1)(F + B − 2W) | 1× | PP | PP |
| DualPipe | (PP/2 − 1)(F&B + B − 3W) | 2× | PP + 1 | PP |
| DualPipeV | (PP/2 − 1)(F&B + B − 3W) | 2× | PP + 1 | PP/2 |

Activations count micro-batch-stages: one micro-batch's activations on one stage. On P ranks DualPipe's PP
is P (the stages of each copy) and DualPipeV's 2P. DualPipeV's 2× is against a pipeline with one stage per
rank: on the same ranks as ZBV, whose V it shares, it holds the same parameters; DualPipe's second copy is
twice what any one-copy schedule holds. Both are data here, like the others — DualPipeV at P = 2 and m = 4,
a pair printed `(0F3;3B1)`, and DualPipe, its second half numbered from m/2:
"""),
        code("""
from workbench.viz import dualpipe as dualpipe_viz, dualpipe_runs

for name in ("dualpipev", "dualpipe"):
    print(f"{name}, P = 2, m = 4:")
    print(build_schedule(name, 2, 4).grid())
built = {(n, p, m): build_schedule(n, p, m)
         for n in ("dualpipev", "dualpipe") for p in (2, 4, 6) for m in (2 * p, 2 * p + 2, 4 * p)}
viz.check("DualPipe and DualPipeV pass the validator (NCCL's rule) at P = 2, 4, 6 and three m each",
          "problems == 0", problems=[len(validate(s)) for s in built.values()])
viz.check("each holds at most PP + 1 micro-batch-stages of activations on a rank (the schedule walked)",
          "held == pp + 1", held=[max(peak_in_flight(s)) for s in built.values()],
          pp=[2 * p if n == "dualpipev" else p for n, p, _ in built]);
"""),
        md("""
### Planned: DualPipe beside ZBV and 1F1B

The simulator replays the four schedules from per-action costs, one time axis, each F&B pair outlined.
The costs are a rank's share of the model, as everywhere above: a V's stage (ZBV, DualPipeV) costs half of
F, a DualPipe stage all of it. `W ÷ B` sets the weight pass's share of a backward, `F&B ÷ (F + B)` what a
pair costs: 1 where nothing overlaps, as on this machine, less where the pair hides communication. Each
title gives the step, the most idle time of any rank, and the README's formula with each stage's costs.
Transfers are free here (gloo's rule: a send never waits for its receive), because the formula assumes
they are.
"""),
        code("""
dualpipe_viz.dualpipe_explorer()
"""),
        md("""
Where does the formula hold? Below: the idle per rank simulated with free transfers beside the README's
formula at P = 2, 4, 8 (m = 4P), in four cases of costs, and the same schedules under NCCL's rule (the
validator's: a send may wait until its receive is posted), which the formula does not count.
"""),
        code("""
plan = pd.DataFrame(dualpipe_viz.formula_table())
sim, nccl = plan["idle per rank, simulated (free transfers)"], plan["simulated under NCCL's rule"]
exact = plan.case.str.startswith("F = I = W")
viz.check("at F = I = W, with F&B between B and F + B, the simulation (free transfers) gives the README's formula",
          "abs(simulated - formula) < 1e-9", simulated=sim[exact], formula=plan["README's formula"][exact])
for case in plan.case[~exact].unique():
    off = (sim - plan["README's formula"])[plan.case == case]
    print(f"{case}: the simulation is {off.min():+.2f} to {off.max():+.2f} off the formula")
worse = (nccl - sim)[plan["P ranks"] >= 4]
print(f"under NCCL's rule, from P = 4 on: {worse.min():+.2f} to {worse.max():+.2f} more idle than with free transfers")
plan.round(3)
"""),
        code("""
equal = pd.DataFrame([{"P": p, "m": 4 * p, **{dualpipe_runs.LABELS[n]: dualpipe_runs.idle_per_rank(
            dualpipe_viz.timeline(n, p, 4 * p, t_f=1.0, t_b=2.0, t_w=1.0))
        for n in ("1f1b", "zbh1", "zbv", "dualpipev", "dualpipe")}} for p in (2, 4, 8)])
viz.check("at F = I = W with nothing overlapping, DualPipeV idles as much as ZB-H1: twice what ZBV idles",
          "np.all(abs(dualpipev - zbh1) < 1e-9) and np.all(abs(dualpipev - 2 * zbv) < 1e-9)",
          dualpipev=equal["DualPipeV"], zbh1=equal["ZB-H1 (the README's ZB1P)"], zbv=equal["ZBV"])
equal
"""),
        md("""
Exact where the costs are the zero-bubble paper's equal ones and the pair takes between B and F + B; an
estimate elsewhere (the lines above say by how much). Without overlap, what DualPipeV buys over ZBV is not
its bubble: the pairs are its point, and they pay only where they hide communication.

### Measured: DualPipeV and DualPipe on 2 ranks

The same `small` model, P = 2, m = 4, as the zero-bubble runs above. DualPipe's second copy is a second
set of stage modules whose gradients are summed with the first's after backward, so both take the same
update: it must still train exactly like one process.
"""),
        code("""
dp_runs = {"1 process": small_single,
           "DualPipeV p=2 m=4": run_small("small-dualpipev", pp=2, schedule="dualpipev", microbatches=4),
           "DualPipe p=2 m=4": run_small("small-dualpipe", pp=2, schedule="dualpipe", microbatches=4)}
dp_losses = viz.compare_losses(dp_runs, baseline="1 process")
viz.check("DualPipeV and DualPipe equal one process within 1e-5 × loss",
          "difference <= 1e-5 * loss", difference=dp_losses.max_abs_diff, loss=dp_losses.final_loss)
dp_runs.pop("1 process")
dp_losses
"""),
        md("""
Their timelines, planned (simulated with the run's mean cost of each kind of action) above what the ranks
recorded, each F&B pair outlined in black — DeepSeek's figures draw a pair so:
"""),
        code("""
viz.planned_vs_measured(dp_runs["DualPipeV p=2 m=4"]).show()
viz.planned_vs_measured(dp_runs["DualPipe p=2 m=4"]).show()
"""),
        md("""
**The overlap of F&B cannot be seen here.** Each rank is one CPU thread: it runs a pair's F, then its B,
and has no second stream for one to communicate on while the other computes. torch's runtime does the same
(`ScheduleDualPipeV` runs an `OVERLAP_F_B` action's forward, then its backward, unless an overlap function
is registered with `register_custom_function`). The trace shows it: each pair's B starts after its F ends.
Where the gap is more than a fraction of a millisecond, the rank waited in between for the B's input
gradient (received lazily: posted before the pair, waited on when the B needs it) — idle time, not the
pair's. A pair's cost in the formula below is its compute, its F's time plus its B's:
"""),
        code("""
pair_rows = pd.concat([dualpipe_runs.pairs(r).assign(run=k) for k, r in dp_runs.items()], ignore_index=True)
viz.check("every F&B pair ran its F, then its B: none overlapped",
          "gap >= 0", gap=pair_rows["B starts after F ends by (ms)"])
costs = {k: dualpipe_runs.measured_costs(r) for k, r in dp_runs.items()}
print("; ".join(f"{k}: a pair computed {c['F&B']:.1f} ms, its F then its B (a stage's mean F + B: "
                f"{c['F'] + c['B']:.1f} ms)" for k, c in costs.items()))
pair_rows.groupby("run")[["F ms", "B ms", "B starts after F ends by (ms)"]].mean().round(3)
"""),
        md("""
### The measured bubble beside the formula

The idle time per rank over a step, measured: the step's window from the first compute action of any rank
to the last, less the rank's own compute time (the most idle rank; median over the steps after the first),
beside the README's formula with the run's own mean F, B, W and F&B (one stage's, in ms) and the schedule
simulated with the same costs (which, unlike the formula, takes them as they are). The 1F1B, ZB-H1 and
ZBV runs are those above, at the same P and m. The last two columns are the rates used above: the bubble
fraction of the step and the zero-bubble paper's rate (idle ÷ work).
"""),
        code("""
same = {k: zb_runs[k] for k in ("1F1B p=2 m=4", "ZB-H1 p=2 m=4", "ZBV p=2 m=4")} | dp_runs
bubble_dp = dualpipe_runs.bubble_table(same).set_index("run")
idle = bubble_dp["idle per rank, measured (ms)"]
viz.check("DualPipe (formula: 0 at P = 2) idles less per rank than ZBV",
          "dualpipe < zbv", dualpipe=idle["DualPipe p=2 m=4"], zbv=idle["ZBV p=2 m=4"],
          margin=viz.headroom(idle["DualPipe p=2 m=4"], idle["ZBV p=2 m=4"]),
          regime="pp 2 on 2 cores, small, m 4", timing="idle measured in two runs on shared cores")
terms = {k: {t: v for t, v in r.summary["bubble_fraction"]["split"].items() if t not in ("measured", "formula")}
         for k, r in same.items()}
print("the largest measured part of each bubble beyond its formula (the summary's split, share of the step): "
      + "; ".join(f"{k}: {max(t, key=lambda n: abs(t[n])).replace('_', ' ')} {max(t.values(), key=abs):+.3f}"
                  for k, t in terms.items()))
bubble_dp.round(3)
"""),
        md("""
### Memory: twice the parameters, PP + 1 micro-batch-stages

Per rank, from the run summaries' `peak_bytes` (the memory counter, by category), and the micro-batch-stages
each rank held at its measured activation peak: the forwards it had begun by then, less the backwards (B
or I) it had finished — beside what the schedule walk says and the README's figure.
"""),
        code("""
act_guess = viz.predict("ZBV's rank 0 holds 4 micro-batch-stages of activations at its peak (2P = 4 stages at "
                        "P = 2). How many will DualPipeV's rank 0 hold?", unit="")
act_guess
"""),
        code("""
memory_dp = dualpipe_runs.memory_table(same)
peak = {k: {c: [r["peak_bytes"][c] for r in run.summary["ranks"]] for c in ("parameter", "activation", "wgrad_stash")}
        for k, run in same.items()}
viz.check("DualPipe holds twice a 2-stage pipeline's parameters on each rank: both 1F1B ranks' together",
          "dualpipe == 2 * np.mean(one_f_one_b)", dualpipe=peak["DualPipe p=2 m=4"]["parameter"],
          one_f_one_b=peak["1F1B p=2 m=4"]["parameter"])
viz.check("DualPipeV holds ZBV's parameters on each rank, to the byte (the same V of stages)",
          "dualpipev == zbv", dualpipev=peak["DualPipeV p=2 m=4"]["parameter"], zbv=peak["ZBV p=2 m=4"]["parameter"])
held = memory_dp["micro-batch-stages held at the peak"]
viz.check("at its measured activation peak each rank held what the schedule walk says",
          "held == walked", held=held, walked=memory_dp["schedule's walk"])
dual = memory_dp.run.str.startswith("Dual")
viz.check("DualPipe and DualPipeV held PP + 1 micro-batch-stages at their peak, the README's figure",
          "held == readme", held=held[dual], readme=memory_dp["README"][dual].astype(int))
v, z = peak["DualPipeV p=2 m=4"], peak["ZBV p=2 m=4"]
viz.check("DualPipeV holds more activation bytes than ZBV on each rank, and a smaller W stash",
          "np.all(act_v > act_z) and np.all(stash_v < stash_z)", act_v=v["activation"], act_z=z["activation"],
          stash_v=v["wgrad_stash"], stash_z=z["wgrad_stash"])
memory_dp.round(2)
"""),
        code("""
rank0 = memory_dp[(memory_dp.run == "DualPipeV p=2 m=4") & (memory_dp["rank"] == 0)].iloc[0]
act_guess.reveal(rank0["micro-batch-stages held at the peak"],
                 f"PP + 1 = 5 with PP = 4 stages: {rank0['activations MB']:.1f} MB of activations, where ZBV's "
                 f"rank 0 held {peak['ZBV p=2 m=4']['activation'][0] / 1e6:.1f} MB; but a W stash of "
                 f"{rank0['W stash MB']:.1f} MB against ZBV's {peak['ZBV p=2 m=4']['wgrad_stash'][0] / 1e6:.1f}: "
                 f"DualPipeV holds at most {peak_pending_w(build_schedule('dualpipev', 2, 4))[0]} W stashes there, "
                 f"ZBV {peak_pending_w(build_schedule('zbv', 2, 4))[0]} — DualPipeV splits a backward only before its "
                 "steady state and in its tail, ZBV wherever a W can fill a gap.")
"""),
        md("""
### What the pairs would buy on a GPU: a what-if

On a GPU an F&B pair hides communication: the forward's expert all-to-all or send runs while the backward
computes, and the other way round. DualPipe was built for that: on DeepSeek-V3's H800 cluster, cross-node
expert parallelism left "an inefficient computation-to-communication ratio of approximately 1:1" (the
report, §3.2.1), time a pair can hide. Here nothing overlaps, so the table below
is a **what-if, predicted, not measured**: the schedules simulated (free transfers) with the DualPipeV run's
measured F, B and W, each pair costing (1 − c)(F + B) — it hides a share c of its F's and its B's time, up
to ½, where communication is as long as computation. 1F1B, ZB-H1 and ZBV have no pairs: their steps do
not move. The explorer above does the same with any costs.
"""),
        code("""
c = costs["DualPipeV p=2 m=4"]
rank_costs = {"t_f": 2 * c["F"], "t_b": 2 * c["B"], "t_w": 2 * c["W"]}  # a rank's share: two of the V's stages
what = pd.concat([pd.DataFrame(dualpipe_viz.what_if(rank_costs, 2, m)).assign(m=m) for m in (4, 16)])
half = what[what["pair hides (share of F + B)"] == 0.5].set_index("m")
viz.check("in the what-if, with pairs hiding half of F + B, DualPipeV's and DualPipe's steps are shorter than ZBV's "
          "at m = 4 and 16", "np.all(dualpipev < zbv) and np.all(dualpipe < zbv)",
          dualpipev=half["DualPipeV step (ms)"], dualpipe=half["DualPipe step (ms)"], zbv=half["ZBV step (ms)"],
          margin=min(viz.headroom(a, z) for k in ("DualPipeV step (ms)", "DualPipe step (ms)")
                     for a, z in zip(half[k], half["ZBV step (ms)"])),
          regime="pp 2, small, predicted from costs measured on 2 shared cores",
          timing="a prediction from F, B and W measured on shared cores")
what.set_index(["m", "pair hides (share of F + B)"]).round(1)
"""),
        md("""
### Where DualPipe beats ZBV, and where it loses

Read from the checks and tables above (P = 2, m = 4, the `small` model):

- **Parameters.** DualPipeV holds ZBV's, to the byte; DualPipe twice a 2-stage pipeline's on each rank —
  the whole model, its gradients and optimizer state with it. That is DualPipe's price, and why DualPipeV
  exists.
- **Activations.** DualPipeV holds PP + 1 = 5 micro-batch-stages at its peak where ZBV holds 4: more bytes
  on each rank. But ZBV fills its bubbles with deferred W's and pays for them in its W stash, which
  DualPipeV keeps smaller on each rank.
- **Bubble, without overlap.** At F = I = W DualPipeV idles twice what ZBV idles (as much as ZB-H1); DualPipe
  at P = 2 idles nothing by the formula and by the simulation with the measured costs. What the runs idled
  here is in the bubble table: on shared cores it moves from run to run (the timing claim beside it says
  how this one came out), and the summary's split names its largest part.
- **Bubble, with overlap.** Only where the pair hides communication does DualPipe pay off: in the what-if,
  with half of F + B hidden, DualPipeV and DualPipe finish a step before ZBV (its check gives the margin with
  these costs). On this machine the pair hides nothing, so that table is a prediction; measuring it takes a
  GPU and an overlap function.
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
