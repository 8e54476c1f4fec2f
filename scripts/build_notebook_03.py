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

Activations are counted two ways here and below: in **micro-batch-stages** (one micro-batch's activations on
one of the schedule's stages: an interleaved chunk, or a V's stage, is a stage) and in **rank shares** (1/p of
the model each: a chunk of v per rank is 1/v of one).

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
                 "activations in flight, rank 0 (micro-batch-stages)": peak_in_flight(sched)[0],
                 "= rank shares": peak_in_flight(sched)[0] / sched.v,
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
latency and deferring W has little to fill. So these runs use the `small` model (4 layers of hidden 256,
global batch 32), where a pass is tens of milliseconds of arithmetic, as a GPU's is against its kernel
launches.

Two measures of the bubble appear from here on, and they need not order the schedules alike. The **bubble
fraction** (the check and the table below) is the idle share of the step, averaged over the ranks; the **idle
per rank** (ms, in the DualPipe section's bubble table) is the most idle rank's, start-up stagger included. That
table puts both side by side for these runs, and says where ZBV's idle comes from: its order was generated at
T_F = T_I = T_W, and with W shorter than I it idles more than at those costs.
"""),
        code("""
from fractions import Fraction

def as_fraction(x):
    return Fraction(x).limit_denominator(100)

zb_formula = {n: formulas.schedule_bubble_fraction(build_schedule(n, 2, 4)) for n in ("1f1b", "zbh1")}
zb_rate = {n: formulas.bubble_rate(n, 2, 4, 1) for n in ("1f1b", "zbh1")}
guess = viz.predict(f"At p = 2 and m = 4 the formula gives 1F1B a bubble of {as_fraction(zb_formula['1f1b'])} of the "
                    f"step and ZB-H1 {as_fraction(zb_formula['zbh1'])} (ZB-H1's rate, idle ÷ work, "
                    f"{as_fraction(zb_rate['zbh1'])}, is {as_fraction(zb_rate['zbh1'] / zb_rate['1f1b'])} of 1F1B's "
                    f"{as_fraction(zb_rate['1f1b'])}). On this machine, with the small model, what bubble fraction "
                    "will ZB-H1 measure?", unit='')
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
viz.check("with real work per micro-batch, ZB-H1's bubble fraction is below 1F1B's",
          "zbh1 < one_f_one_b", zbh1=bubbles["ZB-H1 p=2 m=4"],
          one_f_one_b=bubbles["1F1B p=2 m=4"],
          margin=viz.headroom(bubbles["ZB-H1 p=2 m=4"], bubbles["1F1B p=2 m=4"]),
          regime="pp 2 on 2 cores, small, m 4",
          timing="bubbles measured in two runs on shared cores")
viz.schedules_side_by_side(zb_runs)
"""),
        code("""
from workbench.viz import bubble_split

guess.reveal(bubbles["ZB-H1 p=2 m=4"],
             f"From the formula's fraction ({zb_formula['zbh1']:.3f}) to the measured one, the run's own split of "
             "the bubble (each part measured from its trace; share of the step, and ms of idle averaged over "
             f"the ranks): {bubble_split.line(zb_runs['ZB-H1 p=2 m=4'])}.")
print(f"ZBV's split the same way: {bubble_split.line(zb_runs['ZBV p=2 m=4'])}.")
print("'costs ≠ the formula's' (summary.json's `uneven_stage_costs`) is the schedule simulated with the run's own "
      "mean time per stage and kind, less the formula: stages that differ, and W ≠ I, B ≠ 2F.")
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
That function has a display bug in torch 2.13: it drops a rank's queue once it is empty
(`rank_ops = [q for q in rank_ops if q]`) and numbers the queues left from 0 again, so once rank 0 is done,
rank 1's last actions are drawn in rank 0's row. We give every rank empty steps after its last action, so
that no queue empties early (`viz.zero_bubble.torch_rows`); the printed line says what torch's
spacing does without them.
"""),
        code("""
from workbench.schedules.torch_csv import write_csv

zbh1 = build_schedule("zbh1", 2, 4)
write_csv(zbh1, os.path.join(OUT, "zbh1.csv"))
print(open(os.path.join(OUT, "zbh1.csv")).read())
from workbench.viz.zero_bubble import torch_rows

own = [" ".join(str(a) for a in rank if a.kind in ("F", "B", "I", "W")) for rank in zbh1.actions]
def rows_of(spaced):
    return [" ".join(c for c in row if c) for row in spaced]
alone = rows_of(torch_rows(zbh1, pad=False))
misplaced = [r for r in range(zbh1.p) if r >= len(alone) or alone[r] != own[r]]
print(f"torch's spacing without the padding: {len(misplaced)} of {zbh1.p} rows hold other actions than their rank's"
      + (f" (rank {misplaced[0]}'s row: {alone[misplaced[0]]})" if misplaced else ""))
viz.check("each rank's row of the padded grid holds that rank's actions, in its order", "np.all(rows == own)",
          rows=rows_of(torch_rows(zbh1)), own=own)
viz.torch_grid(zbh1)
"""),
        md("""
## DualPipe and DualPipeV: DeepSeek-V3's bidirectional pipeline (DeepSeek-V3, 2024)

DeepSeek-V3's pipeline (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024, §3.2.1). **DualPipe** keeps two
copies of the model on P ranks and feeds micro-batches in from **both ends at once**: rank r holds stage r of
copy 1, which the first half of the micro-batches goes *down*, and copy 2's part P − 1 − r, which the second
half comes *up* — printed below as stage P + (P − 1 − r), so rank 0 holds stages 0 and 2P − 1. In the steady
state a rank issues one micro-batch's forward together with another's backward, an **F&B pair**: on a GPU the
two overlap, each computing while the other communicates (an expert-parallel all-to-all, a pipeline send). The
last backwards split into I and W, and some leave their W for the tail, as ZB-H1 and ZBV do (the lines under
the grids say where that shows). **DualPipeV** (Sea AI Lab's "cut-in-half") folds it into a V over one copy:
P ranks, 2P stages, rank r holding stages r and 2P − 1 − r — ZBV's placement. It is not fed from both ends:
every micro-batch enters at rank 0, goes down the V and back up, and its loss is computed on rank 0.

The deepseek-ai/DualPipe README compares them "based on the same number of PP stages" (PP: pipeline
stages; F, B, W one stage's forward, full backward and weight pass; F&B an overlapped pair):

| | bubble (idle per rank over a step) | parameters per rank | activations per rank | ranks |
|---|---|---|---|---|
| 1F1B | (PP − 1)(F + B) | 1× | PP | PP |
| ZB1P (our ZB-H1) | (PP − 1)(F + B − 2W) | 1× | PP | PP |
| DualPipe | (PP/2 − 1)(F&B + B − 3W) | 2× | PP + 1 | PP |
| DualPipeV | (PP/2 − 1)(F&B + B − 3W) | 2× | PP + 1 | PP/2 |

Activations count micro-batch-stages: one micro-batch's activations on one stage. On P ranks DualPipe's PP
is P (the stages of each copy; a stage is a rank share, 1/P of one copy) and DualPipeV's 2P (a stage is half a
rank share: its PP + 1 = 2P + 1 half-stages are P + ½ rank shares). For 1F1B and ZB1P the README's PP is the
first rank's count, the most any rank holds. DualPipeV's 2× is against a pipeline with one stage per
rank: on the same ranks as ZBV, whose V it shares, it holds the same parameters; DualPipe's second copy is
twice what any one-copy schedule holds. Both are data here, like the others — DualPipeV at P = 2 and m = 4,
a pair printed `(0F3;3B1)`, and DualPipe, its second half numbered from m/2:
"""),
        code("""
from workbench.analysis import dualpipe_runs
from workbench.viz import dualpipe as dualpipe_viz

def deferred_w(sched):  # per rank: the W's not right after their own I, and the actions from the first such I on
    out = []
    for rank in sched.actions:
        acts = [a for a in rank if a.kind in ("F", "B", "I", "W")]
        late = [i for i, a in enumerate(acts) if a.kind == "W" and (acts[i - 1].kind, acts[i - 1].stage,
                acts[i - 1].microbatch) != ("I", a.stage, a.microbatch)]
        first = min((j for j, a in enumerate(acts) if a.kind == "I" and any(
            (acts[i].stage, acts[i].microbatch) == (a.stage, a.microbatch) for i in late)), default=len(acts))
        out.append((len(late), " ".join(map(str, acts[first:]))))
    return out

for name in ("dualpipev", "dualpipe"):
    print(f"{name}, P = 2, m = 4:")
    print(build_schedule(name, 2, 4).grid())
    print("  W's not right after their own I, per rank:", [n for n, _ in deferred_w(build_schedule(name, 2, 4))])
dp4 = deferred_w(build_schedule("dualpipe", 4, 8))
print("dualpipe, P = 4, m = 8: W's not right after their own I, per rank:", [n for n, _ in dp4])
for r, (n, tail) in enumerate(dp4):
    if n:
        print(f"  rank {r}'s tail: {tail}")
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
pair costs: 1 where nothing overlaps (on this machine a pair runs its F, then its B: the measured pairs
below), less where the pair hides communication. Each
title gives the step, the most idle time of any rank, and the README's formula with each stage's costs.
Transfers are free here (gloo's rule: a send never waits for its receive), because the formula assumes
they are.
"""),
        code("""
dualpipe_viz.dualpipe_explorer()
"""),
        md("""
Where does the formula hold? Below: the idle per rank simulated with free transfers beside the README's
formula at P = 2, 4, 8 (m = 4P), in five cases of costs, and the same schedules under NCCL's rule (the
validator's: a send may wait until its receive is posted), which the formula does not count. Costs and idle
are in a rank's F (F = 1). The simulator takes a rank's costs; the README's F, B, W are a stage's, and a V's
stage is half a rank's share, so the formula takes DualPipeV's costs halved (the column "costs (a stage's)";
the first line under the check works one row by hand).

Under NCCL's rule DualPipe and DualPipeV idle more from P = 4 on (the last column). That is a property of our
posting, not of DualPipe (docs/formulas.md, "Under NCCL's rule"): our lockstep rounds put, in a pair's batch,
receives that only the next pair needs, and an NCCL group finishes as one, so the pair waits for them;
simulated with each receive finishing on its own, the numbers return to the free-transfer ones. ZB-H1 and ZBV
lose nothing under that rule (the second check).
"""),
        code("""
plan = pd.DataFrame(dualpipe_viz.formula_table())
sim, nccl, readme = plan[dualpipe_viz.SIMULATED], plan[dualpipe_viz.UNDER_NCCL], plan[dualpipe_viz.README]
exact = plan.case.str.startswith("F = I = W")
viz.check("at F = I = W, with F&B between B and F + B, the simulation (free transfers) gives the README's formula",
          "abs(simulated - formula) < 1e-9", simulated=sim[exact], formula=readme[exact])
first = plan.iloc[0]  # DualPipeV, P = 2, the first case
case, t_f, t_b, t_w, t_fb = dualpipe_viz.CASES[0]
pp, half = dualpipe_runs.stages_pp("dualpipev", first["P ranks"]), 0.5  # a V's stage: half a rank's share
by_hand = (pp / 2 - 1) * (half * t_fb + half * t_b - 3 * half * t_w)
print(f"by hand, {first.schedule} at P = {first['P ranks']} ({case}): (PP/2 − 1)(F&B + B − 3W) with a stage's "
      f"costs = ({pp}/2 − 1)({half * t_fb:g} + {half * t_b:g} − 3·{half * t_w:g}) = {by_hand:g} rank's F; with a "
      f"rank's it would be {(pp / 2 - 1) * (t_fb + t_b - 3 * t_w):g}; the table: {first[dualpipe_viz.README]:g}")
for case in plan.case[~exact].unique():
    off = (sim - readme)[plan.case == case]
    print(f"{case}: the simulation is {off.min():+.2f} to {off.max():+.2f} off the formula")
worse = (nccl - sim)[plan["P ranks"] >= 4]
print(f"under NCCL's rule, from P = 4 on: {worse.min():+.2f} to {worse.max():+.2f} more idle than with free transfers")
zb_rule = {rule: [dualpipe_runs.idle_per_rank(dualpipe_viz.timeline(n, p, 4 * p, t_f=1.0, t_b=2.0, t_w=1.0, rule=rule))
                  for n in ("zbh1", "zbv") for p in (2, 4, 8)] for rule in ("gloo", "nccl")}
viz.check("ZB-H1 and ZBV idle no more under NCCL's rule than with free transfers (P = 2, 4, 8, m = 4P, F = I = W)",
          "np.all(abs(nccl - free) < 1e-9)", nccl=zb_rule["nccl"], free=zb_rule["gloo"])
plan.round(3)
"""),
        code("""
equal = pd.DataFrame([{"P": p, "m": 4 * p, **{dualpipe_runs.LABELS[n]: dualpipe_runs.idle_per_rank(
            dualpipe_viz.timeline(n, p, 4 * p, t_f=1.0, t_b=2.0, t_w=1.0))
        for n in ("1f1b", "zbh1", "zbv", "dualpipev", "dualpipe")}} for p in (2, 4, 8)])
viz.check("at F = I = W with nothing overlapping, DualPipeV idles as much as ZB-H1: twice what ZBV idles",
          "np.all(abs(dualpipev - zbh1) < 1e-9) and np.all(abs(dualpipev - 2 * zbv) < 1e-9)",
          dualpipev=equal["DualPipeV"], zbh1=equal["ZB-H1 (the README's ZB1P)"], zbv=equal["ZBV"])
zbv_rates = [dualpipe_viz.timeline("zbv", p, 4 * p, t_f=1.0, t_b=2.0, t_w=1.0).bubble_rate() for p in (2, 4, 8)]
print(f"ZBV's bubble rate (idle between a rank's first and last action ÷ its work) at P = 2, 4, 8: {zbv_rates}: "
      + ("its idle here is its start-up stagger alone, which the zero-bubble paper's rate of 0 leaves out."
         if max(zbv_rates) == 0 else "it idles between its actions too, not only in its start-up stagger."))
equal
"""),
        md("""
The README's formula is exact where the costs are the zero-bubble paper's equal ones and the pair takes between
B and F + B; an estimate elsewhere (the lines above say by how much). At F = I = W, without overlap,
DualPipeV's bubble is twice ZBV's (the check above) and DualPipe's at P = 2 is zero. Those are the equal costs
the zero-bubble orders are made for. The what-if at the end of this section feeds the schedules this machine's
measured costs (it prints W ÷ I) and compares them as m grows, first with nothing hidden, then with the pairs
hiding communication.

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
print("Two step times: the launch line's s/step is the launcher's wall clock from the first step's metrics to the "
      "end of the launch, over the steps after the first, so it also counts writing the traces and the summary and "
      "closing the ranks; the table's median_step_ms is the median of the steps' own clock (metrics.jsonl's "
      "step_time_s), step 0 included:")
for k, r in dp_runs.items():
    t = 1e3 * r.metrics.step_time_s
    print(f"  {k}: median over all {len(t)} steps {t.median():.1f} ms (step 0: {t.iloc[0]:.1f} ms); "
          f"over the steps after the first {t.iloc[1:].median():.1f} ms")
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
is registered with `register_custom_function`). So a pair's F runs, then its B; the time between them (its
range is printed below) holds the rank's wait for the B's input gradient, received lazily (posted before the
pair, waited on when the B needs it), which is idle time, not the pair's. A pair's cost in the formula below
is its F's time plus its B's.

Does pairing change what an action costs? Below, each kind of pair's F and B beside the same stages' F and B
outside a pair, and the ratio of the two sums: 1 where pairing changes nothing; a pair that hid a quarter of
its time would give 0.75, half of it 0.5 (the check's limit: the what-if's largest c). Then, for the stages
that hold the head and the loss, each forward by what the rank ran just before it.
"""),
        code("""
from IPython.display import Markdown, display

pair_rows = pd.concat([dualpipe_runs.pairs(r).assign(run=k) for k, r in dp_runs.items()], ignore_index=True)
pairing = pd.concat([dualpipe_runs.pairing(r).assign(run=k) for k, r in dp_runs.items()], ignore_index=True)
ratio = pairing["paired F + B ÷ unpaired"]
ratio = ratio[ratio != "—"].astype(float)
viz.check("pairing hides less than half of a pair's time (the what-if's largest c, ½): paired F + B ÷ the "
          "same stages' unpaired F + B above 0.5 for every kind of pair", "np.all(ratio > 0.5)", ratio=ratio,
          margin=viz.headroom(ratio.min(), 0.5, below=False),
          regime="pp 2 on 2 cores, small, m 4", timing="single actions' compute times on shared cores")
display(pairing.set_index(["run", "rank", "pair"]).round(2))
gap = pair_rows["B starts after F ends by (ms)"]
print(f"From a pair's F's end to its B's start: {gap.min():.2f} to {gap.max():.2f} ms over {len(gap)} pairs.")
costs = {k: dualpipe_runs.measured_costs(r) for k, r in dp_runs.items()}
after = pd.concat([dualpipe_runs.forwards_after(r).assign(run=k) for k, r in dp_runs.items()], ignore_index=True)
for k, r in dp_runs.items():
    heads = dualpipe_runs.head_stages(r)
    rows = pairing[(pairing.run == k) & pairing.pair.str.startswith(tuple(f"F of stage {h};" for h in heads))]
    paired, alone = rows["F ms, paired"].astype(float), rows["F ms, unpaired"].replace("—", float("nan")).astype(float)
    word = ("faster" if (paired < alone).all() else "slower" if (paired > alone).all() else "neither faster nor slower")
    print(f"{k}: a pair's F + B, {costs[k]['F&B']:.1f} ms, is its F's time plus its B's. On the head stages "
          f"{heads}, a paired F took {', '.join(f'{x:.1f}' for x in paired)} ms, an unpaired one "
          f"{', '.join(f'{x:.1f}' for x in alone)} ms: {word} in a pair.")
print("Nothing runs beside a paired F, so a faster one is not overlap. What differs is the action just before it "
      "(the table below: a forward right after its own stage's action, after another stage's, or first in the step); "
      "whether that is the cause (a cache left warm by the stage's own weights would be one) this trace cannot "
      "test, so it is unexplained here.")
after[after["holds the head"]].drop(columns="holds the head").set_index(["run", "stage"])
"""),
        md("""
### The measured bubble beside the formula

All five runs at P = 2 ranks (`pp = 2`) and m = 4, the 1F1B, ZB-H1 and ZBV ones from above; PP, the README's
number of stages, is 4 for the V schedules (ZBV, DualPipeV) and 2 for the others. The F, B, W and F&B columns
are one stage's mean (ms): a V's stage holds half the layers the others' stages hold (a rank holds two of
them), and the what-if below doubles its costs back to a rank's. ZBV ran no B: its B is I + W.

Three measures of the bubble, each over the steps after the first:

- **idle per rank, measured (ms)**: per step, the window from the first compute action of any rank to the
  last, less the rank's own compute time; the most idle rank, the median over the steps. It counts the
  start-up stagger where there is one (in a one-way pipeline the second rank waits for the first's forward).
- **bubble fraction, measured**: the same idle as a share of the window, averaged over the ranks
  (summary.json's `bubble_fraction.measured`).
- **bubble rate, measured**: the zero-bubble paper's rate: a rank's idle between its own first and last
  compute action (the stagger left out) over its compute time; the most idle rank (`measured_rate`).

Beside them: the formula with the run's own mean costs (the README's for 1F1B, ZB-H1 and DualPipe(V); for
ZBV, which the README does not list, the zero-bubble paper's rate 0 plus the stagger) and the schedule
simulated with one mean cost per kind of action (F, B, I, W), which, unlike the formula, takes the costs as
they are. The lines under the check split the gaps. Each run's bubble split is the summary's: it starts from
the formula at equal costs (not the measured ones the formula column takes) and simulates each stage with its
own costs, so its "costs ≠ the formula's" holds what the formula column already takes in, and more.
"""),
        code("""
same = {k: zb_runs[k] for k in ("1F1B p=2 m=4", "ZB-H1 p=2 m=4", "ZBV p=2 m=4")} | dp_runs
bubble_dp = dualpipe_runs.bubble_table(same).set_index("run")
idle = bubble_dp["idle per rank, measured (ms)"]
viz.check("DualPipe (formula: 0 at P = 2) idles less per rank than ZBV",
          "dualpipe < zbv", dualpipe=idle["DualPipe p=2 m=4"], zbv=idle["ZBV p=2 m=4"],
          margin=viz.headroom(idle["DualPipe p=2 m=4"], idle["ZBV p=2 m=4"]),
          regime="pp 2 on 2 cores, small, m 4", timing="idle measured in two runs on shared cores")
plan_idle, frac = bubble_dp[dualpipe_runs.SIMULATED_IDLE], bubble_dp["bubble fraction, measured"]
D, Z, V, O = "DualPipe p=2 m=4", "ZBV p=2 m=4", "DualPipeV p=2 m=4", "1F1B p=2 m=4"
parts = {"ZBV measured − ZBV simulated": idle[Z] - plan_idle[Z],
         "ZBV simulated − DualPipe simulated": plan_idle[Z] - plan_idle[D],
         "DualPipe simulated − DualPipe measured": plan_idle[D] - idle[D]}
print(f"The margin: of the {idle[Z] - idle[D]:.1f} ms between ZBV's and DualPipe's measured idle, "
      + ", ".join(f"{k} {v:+.1f} ms" for k, v in parts.items())
      + f"; the largest part is {max(parts, key=lambda k: abs(parts[k]))}.")
print(f"DualPipeV idled {'more' if idle[V] > idle[Z] else 'less'} than ZBV here ({idle[V]:.1f} against {idle[Z]:.1f} "
      f"ms: ×{idle[V] / idle[Z]:.2f}); simulated with the runs' own costs ×{plan_idle[V] / plan_idle[Z]:.2f}, at "
      f"F = I = W ×{equal['DualPipeV'][0] / equal['ZBV'][0]:g}. ZBV's measured idle is "
      f"{idle[Z] / plan_idle[Z]:.1f}× its simulation; the largest parts of its split beyond the formula (below): "
      + ", ".join(f"{k} {v:+.1f} ms" for k, v in sorted(
          ((k, v) for k, v in bubble_split.split_ms(same[Z]).items() if k != "formula"),
          key=lambda kv: -abs(kv[1]))[:3])
      + ".")
agree = (idle[Z] > idle[O]) == (frac[Z] > frac[O])
print(f"ZBV against 1F1B: idle per rank {idle[Z]:.1f} against {idle[O]:.1f} ms "
      f"({'more' if idle[Z] > idle[O] else 'less'}), bubble fraction {frac[Z]:.3f} against {frac[O]:.3f} "
      f"({'more' if frac[Z] > frac[O] else 'less'}): "
      + ("the two measures agree here." if agree else "the two measures disagree: the fraction averages over the "
         "ranks, the idle per rank takes the most idle one, stagger included."))
print("Each run's bubble split (the summary's; share of the step, and ms of idle averaged over the ranks):")
for k, r in same.items():
    print(f"  {k}: {bubble_split.line(r)}")
bubble_dp.round(3)
"""),
        md("""
### Memory: DualPipe's twice the parameters, PP + 1 micro-batch-stages

Per rank, from the run summaries' `peak_bytes` (the memory counter, by category), and the micro-batch-stages
each rank held at its measured activation peak: the forwards it had begun by then, less the backwards (B
or I) it had finished — a count taken at the moment the bytes peaked, in the schedule's stages and in rank
shares (a V's stage is half of one) — beside what the schedule walk says and the README's figure. The README
gives 1F1B and ZB1P PP, the first rank's count, the most any rank holds: their second rank holds fewer.
"""),
        code("""
zbv_held = peak_in_flight(build_schedule("zbv", 2, 4))[0]
act_guess = viz.predict(f"ZBV's rank 0 holds {zbv_held} micro-batch-stages (half-stages: {zbv_held / 2:g} rank "
                        "shares) of activations at its peak, with 2P = 4 stages at P = 2. How many "
                        "micro-batch-stages will "
                        "DualPipeV's rank 0 hold?", unit="")
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
count = memory_dp.set_index(["run", "rank"])["micro-batch-stages held at the peak"]
viz.check("on rank 1 (no embedding, no head) DualPipeV's activation bytes over ZBV's are the micro-batch-stages "
          "each held at its peak, over each other", "abs(bytes_ratio - count_ratio) < 1e-9",
          bytes_ratio=v["activation"][1] / z["activation"][1],
          count_ratio=count["DualPipeV p=2 m=4", 1] / count["ZBV p=2 m=4", 1])
memory_dp.round(2)
"""),
        code("""
rank0 = memory_dp[(memory_dp.run == "DualPipeV p=2 m=4") & (memory_dp["rank"] == 0)].iloc[0]
held_v, held_z = count["DualPipeV p=2 m=4", 1], count["ZBV p=2 m=4", 1]
act_guess.reveal(rank0["micro-batch-stages held at the peak"],
                 f"PP + 1 = {dualpipe_runs.stages_pp('dualpipev', 2) + 1} with PP = "
                 f"{dualpipe_runs.stages_pp('dualpipev', 2)} stages, counted at the moment the bytes peaked "
                 f"({rank0['= rank shares']:g} rank shares). The bytes "
                 f"measure it on rank 1, which holds no embedding and no head: DualPipeV's "
                 f"{v['activation'][1] / 1e6:.2f} MB over ZBV's {z['activation'][1] / 1e6:.2f} MB = "
                 f"{v['activation'][1] / z['activation'][1]:.3f} = {held_v}/{held_z}. On rank 0: "
                 f"{rank0['activations MB']:.1f} MB of activations, where ZBV's "
                 f"rank 0 held {peak['ZBV p=2 m=4']['activation'][0] / 1e6:.1f} MB; but a W stash of "
                 f"{rank0['W stash MB']:.1f} MB against ZBV's {peak['ZBV p=2 m=4']['wgrad_stash'][0] / 1e6:.1f} MB: "
                 f"DualPipeV holds at most {peak_pending_w(build_schedule('dualpipev', 2, 4))[0]} W stash(es) there, "
                 f"ZBV {peak_pending_w(build_schedule('zbv', 2, 4))[0]} — DualPipeV splits a backward only before its "
                 "steady state and in its tail, ZBV wherever a W can fill a gap.", label="counted at the measured peak")
"""),
        md("""
### What the pairs would buy on a GPU: a what-if

On a GPU an F&B pair hides communication: the forward's expert all-to-all or send runs while the backward
computes, and the other way round. DualPipe was built for that: on DeepSeek-V3's H800 cluster, cross-node
expert parallelism left "an inefficient computation-to-communication ratio of approximately 1:1" (the
report, §3.2.1), time a pair can hide. Here nothing overlaps, so the table below is a **what-if, predicted,
not measured**, on one assumption: *the measured F and B are read as a GPU's, a share c of which is
communication*. In a pair each half's communication runs beside the other's computation, so a pair costs
(1 − c)(F + I) + W: c applies to F and to I (B = I + W), not to W, which has no all-to-all. c goes up to ½,
where communication is as long as computation. An action outside a pair keeps its whole time, so 1F1B, ZB-H1
and ZBV do not move with c. The costs are the DualPipeV run's mean F, B and W of a stage (the bubble table's),
doubled to a rank's share (a rank holds two of the V's stages), simulated at P = 2 with free transfers.
**Pipeline only**: DualPipe's twin-gradient exchange and its doubled optimizer step are not in it. The
explorer above does the same with any costs.
"""),
        code("""
c = costs["DualPipeV p=2 m=4"]
rank_costs = {"t_f": 2 * c["F"], "t_b": 2 * c["B"], "t_w": 2 * c["W"]}  # a rank's share: two of the V's stages
w_over_i = c["W"] / (c["B"] - c["W"])
ms = (4, 8, 16, 32)
idle_m = pd.DataFrame(dualpipe_viz.idle_against_m(rank_costs, 2, ms)).set_index("m")
what = pd.concat([pd.DataFrame(dualpipe_viz.what_if(rank_costs, 2, m)).assign(m=m) for m in ms])
hides = "pair hides c of F and I"
none, half = (what[what[hides] == x].set_index("m") for x in (0.0, 0.5))
step = {n: f"{n} step (ms)" for n in ("ZBV", "DualPipeV", "DualPipe")}
zbv_idle, dpv_idle = idle_m["ZBV"], idle_m["DualPipeV"]
slope = (zbv_idle[ms[-1]] - zbv_idle[ms[-2]]) / (ms[-1] - ms[-2])
shorter = [m for m in ms if none.loc[m, step["DualPipeV"]] < none.loc[m, step["ZBV"]]]
from_m = (f"from m = {shorter[0]} on" if shorter and shorter == [m for m in ms if m >= shorter[0]]
          else f"at m = {shorter}" if shorter else "at none of these m")
grows = zbv_idle.is_monotonic_increasing and zbv_idle.iloc[-1] > zbv_idle.iloc[0]
print(f"This run's costs: W = {w_over_i:.2f} × I (I = B − W); ZBV's order was generated at T_F = T_I = T_W. With "
      f"nothing hidden (c = 0), the idle per rank at m = {', '.join(map(str, ms))}: ZBV "
      f"{', '.join(f'{x:.1f}' for x in zbv_idle)} ms ({'growing' if grows else 'not growing'} with m: "
      f"{slope:+.2f} ms a micro-batch, where one stage's I − W is {c['B'] - 2 * c['W']:.2f} ms); DualPipeV "
      f"{', '.join(f'{x:.1f}' for x in dpv_idle)} ms; DualPipe {', '.join(f'{x:.1f}' for x in idle_m['DualPipe'])} ms. "
      f"DualPipeV's step is shorter than ZBV's {from_m}.")
viz.check("in the what-if, DualPipe's step is shorter than ZBV's at every m from c = 0 (nothing hidden: at P = 2 it "
          "has no bubble), and DualPipeV's too with pairs hiding half of F and I",
          "np.all(dualpipe_c0 < zbv) and np.all(dualpipe_half < zbv) and np.all(dualpipev_half < zbv)",
          dualpipe_c0=none[step["DualPipe"]], dualpipe_half=half[step["DualPipe"]],
          dualpipev_half=half[step["DualPipeV"]], zbv=none[step["ZBV"]],
          margin=min(viz.headroom(a, z) for col in (none[step["DualPipe"]], half[step["DualPipe"]],
                                                    half[step["DualPipeV"]]) for a, z in zip(col, none[step["ZBV"]])),
          regime="pp 2, small, predicted from costs measured on 2 shared cores",
          timing="a prediction from F, B and W measured on shared cores")
what.set_index(["m", hides]).round(1)
"""),
        md("""
### Where DualPipe beats ZBV, and where it loses

Read from the checks and tables above (P = 2, m = 4 unless said, the `small` model); every figure below is this
run's:
"""),
        code("""
def than(a, b):
    return "more" if a > b else "less" if a < b else "as much"

def both(xs):
    return "/".join(f"{x:.1f}" for x in xs)

pv, pz = peak[V], peak[Z]
total = {k: [(a + w) / 1e6 for a, w in zip(peak[k]["activation"], peak[k]["wgrad_stash"])] for k in (V, Z)}
lower = all(a < b for a, b in zip(total[V], total[Z]))
higher = all(a > b for a, b in zip(total[V], total[Z]))
display(Markdown("\\n".join("- " + line for line in [
    "**Parameters.** DualPipeV holds ZBV's, to the byte; DualPipe twice a 2-stage pipeline's on each rank — the "
    "whole model, its gradients and optimizer state with it (the checks above). That is DualPipe's price, and why "
    "DualPipeV exists.",
    f"**Activations.** DualPipeV held PP + 1 = {count[V, 0]} micro-batch-stages at its peak where ZBV held "
    f"{count[Z, 0]} (rank 0; {count[V, 0] / 2:g} against {count[Z, 0] / 2:g} rank shares): activation bytes "
    f"{both(a / 1e6 for a in pv['activation'])} MB against {both(a / 1e6 for a in pz['activation'])} MB on ranks 0/1. "
    f"ZBV fills its bubbles with deferred W's and pays in its W stash: {both(w / 1e6 for w in pz['wgrad_stash'])} MB "
    f"against DualPipeV's {both(w / 1e6 for w in pv['wgrad_stash'])} MB. Activations and W stash together, each at "
    f"its own peak (an upper bound: the two peaks need not coincide): DualPipeV {both(total[V])} MB, ZBV "
    f"{both(total[Z])} MB — "
    + ("less for DualPipeV on each rank." if lower else "more for DualPipeV on each rank." if higher
       else "neither less nor more on every rank."),
    f"**Bubble, without overlap.** At F = I = W DualPipeV idles ×{equal['DualPipeV'][0] / equal['ZBV'][0]:g} what "
    "ZBV idles (as much as ZB-H1) and DualPipe at P = 2 nothing. "
    + ("Those are not this machine's costs" if abs(w_over_i - 1) > 0.05 else "This machine's costs are near them")
    + f": with W = {w_over_i:.2f} × I, ZBV's order idles {both(zbv_idle)} ms per rank at m = "
    f"{', '.join(map(str, ms))} against DualPipeV's {both(dpv_idle)}, and DualPipeV's step is shorter than "
    f"ZBV's {from_m} with nothing hidden "
    "(the what-if at c = 0). DualPipe, with no bubble at P = 2, is shorter at "
    + ("every m" if (none[step['DualPipe']] < none[step['ZBV']]).all() else "not every m")
    + " there — before it pays its twin-gradient exchange and doubled optimizer step, which the what-if leaves "
    f"out. Measured here: DualPipeV idled {idle[V]:.1f} ms per rank, {than(idle[V], idle[Z])} than ZBV's "
    f"{idle[Z]:.1f}; DualPipe {idle[D]:.1f}; ZBV idled {idle[Z] / plan_idle[Z]:.1f}× its own simulation. On "
    "shared cores these move from run to run (the timing claims say how this run came out).",
    f"**Bubble, with overlap.** With pairs hiding half of F and I, the what-if's steps at m = {ms[0]}: DualPipeV "
    f"{half.loc[ms[0], step['DualPipeV']]:.1f} ms, DualPipe {half.loc[ms[0], step['DualPipe']]:.1f} ms, ZBV "
    f"{none.loc[ms[0], step['ZBV']]:.1f} ms (its check gives the margin). On this machine the pair hides nothing, "
    "so that is a prediction; measuring it takes a GPU and an overlap function.",
])))
"""),
        md("""
## The bubble against m, measured beside the formula

Here the stages need real work for the bubble to be about compute, not latency: the `small` model
(4 layers of hidden 256), global batch 32. The formula assumes equal stage times and free
communication. The measured bubble differs from it (the error column), and the run's summary splits the gap
into measured parts (`bubble_fraction.split`, each read from the trace): **costs ≠ the formula's** (the key
`uneven_stage_costs`: the schedule simulated with the run's own mean time per stage and kind, less the formula;
1F1B's formula holds for any B ÷ F, so here that is the stages' differences — the last stage also runs the head
and the loss, so it is slower, and the first waits for it; Megatron-LM lets you give the first and last stages
fewer layers with `--decoder-first-pipeline-num-layers` for that reason) — the **host gaps**
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
                 **{f"+ {w}": v for w, v in bubble_split.split(r).items() if w != "formula"}})
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
