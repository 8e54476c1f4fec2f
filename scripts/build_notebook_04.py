"""Regenerates notebooks/04_zero.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 4 · ZeRO: partition the optimizer states, the gradients, the parameters

Data parallelism keeps a full copy of the **model states** on every rank: with mixed-precision Adam
2Ψ (16-bit parameters) + 2Ψ (16-bit gradients) + 12Ψ (fp32 master weights, momentum, variance)
= 16Ψ bytes. ZeRO (Rajbhandari et al. 2020) removes the redundancy over the N data-parallel ranks:

| stage | partitioned | model states per rank |
|---|---|---|
| 1 | optimizer states | 4Ψ + 12Ψ/N |
| 2 | + gradients | 2Ψ + 14Ψ/N |
| 3 | + parameters | 16Ψ/N |

The paper's example: Ψ = 7.5 billion on N = 64 GPUs — 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU.

That is the paper's accounting, with 16-bit gradients. Megatron-LM — and this workbench's mixed precision,
by default — accumulates and all-reduces the gradients in fp32 (`main_grad`, 4Ψ): **18Ψ** per rank
without ZeRO (notebook 06 measures both). The explorer offers both accountings, and ZeRO-Offload, which
moves the optimizer states (12Ψ/N of them, with the fp32 gradient slice: 16Ψ/N) to the host's memory.
"""),
        code("""
import os
import pandas as pd
import plotly.express as px
import workbench as wb
from workbench import viz
from workbench.predict import formulas
from workbench.viz.zero import formula_explorer

pd.DataFrame([{"stage": z, "GB per GPU": sum(formulas.model_state_bytes(7.5e9, 64, z, "mixed").values()) / 1e9}
              for z in range(4)])
"""),
        md("The formula explorer: move Ψ, N and the stage; pick the accounting; tick offload."),
        code("""
formula_explorer(params=7.5e9, n=64)
"""),
        md("""
## Measured: the same model with stages 0–3 on this machine

fp32 here (the CPU has no fast 16-bit matmul), where the same accounting is parameters 4Ψ,
gradients 4Ψ, Adam's moments 8Ψ. A model whose **states dominate** — 16 small layers (Ψ ≈ 0.83 M:
16Ψ ≈ 13 MB of states against ≈ 1 MB of activations), so that the saving is what the total shows —
with 0.05 MB buckets, as one process, data parallelism and ZeRO-1/2/3 on 2 ranks, with
`profile_memory=True` (the allocator's view beside ours). Each run must equal one process step by step.
Predict first, in the box below.
"""),
        code("""
guess = viz.predict("ZeRO-3 on 2 ranks halves the model states (16Ψ → 8Ψ). By what percentage will a ZeRO-3 rank's "
                    "total at its peak — everything it holds at once — fall below a data-parallel rank's?", unit=' %')
guess
"""),
        code("""
OUT = os.path.join("..", "traces", "nb04")
STATES_DOMINATE = {"vocab_size": 256, "seq_len": 8, "hidden": 64, "heads": 4, "layers": 16}

def run(name, **config):
    return wb.launch(wb.RunConfig(model=STATES_DOMINATE, steps=4, global_batch=4, bucket_mb=0.05, seed=0,
                                  profile_memory=True, profile_memory_step=1, **config),
                     out=os.path.join(OUT, name), force=True)

runs = {
    "1 process": run("single"),
    "dp=2": run("dp2", dp=2),
    "ZeRO-1": run("zero1", dp=2, zero=1),
    "ZeRO-2": run("zero2", dp=2, zero=2),
    "ZeRO-3": run("zero3", dp=2, zero=3),
}
losses = viz.compare_losses(runs, baseline="1 process")
viz.check("every stage's losses equal one process's within 1e-5 × loss",
          "difference <= 1e-5 * loss", difference=losses.max_abs_diff, loss=losses.final_loss)
losses
"""),
        md("""
**The step times in that table are not this lesson's point, but they need a word.** These runs are set up to
measure memory: a model of 16 small layers and 0.05 MB buckets, so each step is many small collectives. ZeRO-1
and ZeRO-2 move the same bytes as data parallelism (below), yet their steps are longer here. The table splits
rank 0's step as its trace measured it, and the line under it says where each stage's extra time went, in
compute and in time blocked on communication. None of it is bytes: the bytes are equal. ZeRO-1/2 make twice
the collectives a step (a reduce-scatter and an all-gather for each of data parallelism's all-reduces), each a
gloo call on cores the ranks share; how much each call costs here varies from run to run and stage to stage.
On NCCL a reduce-scatter plus an all-gather costs what an all-reduce costs (an all-reduce *is* the two) and
runs on the network, not the cores, so the stages' step times converge there.
"""),
        code("""
from workbench.trace.spans import intersection_length, union_length  # what summary.json counts time with

def intervals(spans):  # a table's spans as (start_us, end_us)
    return list(zip(spans.start_us, spans.end_us))

def step_split(r):  # rank 0's step, part by part, from its trace (the steps after the first)
    ev = r.events[(r.events["rank"] == 0) & (r.events.step >= 1)]
    n = ev.step.nunique()
    blocked = ev[(ev.cat == "wait") | ((ev.cat == "collective") & (ev.kind == "span"))]
    work = ev[ev.cat.isin(["forward", "backward", "optimizer"])]
    return {"median step (ms)": 1e3 * r.metrics.step_time_s.iloc[1:].median(),
            "compute (ms)": (work.dur_us.sum() - intersection_length(intervals(work), intervals(blocked))) / 1e3 / n,
            "host blocked on communication (ms)": union_length(intervals(blocked)) / 1e3 / n,
            "collectives a step": len(ev[ev.cat == "collective"]) / n}

split_table = pd.DataFrame({name: step_split(r) for name, r in runs.items() if name != "1 process"}).T
extra = split_table - split_table.loc["dp=2"]
print("over data parallelism's step: " + "; ".join(
    f"{name} {row['median step (ms)']:+.0f} ms (compute {row['compute (ms)']:+.0f}, blocked on communication "
    f"{row['host blocked on communication (ms)']:+.0f})" for name, row in extra.drop("dp=2").iterrows()))
split_table.round(1)
"""),
        code("""
viz.stages_side_by_side({k: v for k, v in runs.items() if k != "1 process"}).show()
"""),
        code("""
rows = []
for name, r in runs.items():
    s = r.summary["ranks"][0]
    for cat in ("parameter", "gradient", "optimizer_state"):
        rows.append({"run": name, "category": cat, "measured": s["peak_bytes"][cat],
                     "predicted": s["predicted_bytes"][cat]})
states = pd.DataFrame(rows)
states["error %"] = 100 * (states.measured - states.predicted) / states.predicted
viz.check("model states measured within 3 % of the formula", "abs(error_percent) <= 3",
          error_percent=states["error %"])
states.pivot(index="run", columns="category", values="measured")
"""),
        md("""
## What a rank really pays: the simultaneous total

Model states are not all a rank holds. The figure that counts is `peak_total_bytes` — every category
at the same instant, including the gradient copies ZeRO-2/3 keep in flight (at most two buckets or
layers) and the layers ZeRO-3 gathers — checked against what the allocator held.
"""),
        code("""
totals = {}
for name, r in runs.items():
    if name == "1 process":
        continue
    s = r.summary["ranks"][0]
    totals[name] = {"measured total (MB)": s["peak_total_bytes"] / 1e6,
                    "allocator peak (MB)": s["allocator_peak_bytes"]["allocated"] / 1e6,
                    "predicted model states (MB)": sum(s["predicted_bytes"][c] for c in
                                                       ("parameter", "gradient", "optimizer_state")) / 1e6}
table = pd.DataFrame(totals).T
table["saving vs DP, measured"] = 1 - table["measured total (MB)"] / table.loc["dp=2", "measured total (MB)"]
table["saving vs DP, model states (formula)"] = (1 - table["predicted model states (MB)"]
                                                 / table.loc["dp=2", "predicted model states (MB)"])
# what a rank pays falls stage by stage, and ZeRO-2/3's total stays within the prediction (model states,
# activations and the gradient copies in flight: formulas.buffer_bytes; 1 % for Adam's step counters)
viz.check("each stage pays less in total than the one before",
          "all(np.diff(total_MB) < 0)", total_MB=table["measured total (MB)"])
for name in ("ZeRO-2", "ZeRO-3"):
    s = runs[name].summary["ranks"][0]
    viz.check(f"{name}: measured total within the prediction (+1 %)",
              "measured_MB <= 1.01 * predicted_MB", measured_MB=s["peak_total_bytes"] / 1e6,
              predicted_MB=sum(s["predicted_bytes"].values()) / 1e6)
for name in ("ZeRO-1", "ZeRO-2", "ZeRO-3"):
    measured, formula = table.loc[name, ["saving vs DP, measured", "saving vs DP, model states (formula)"]]
    print(f"{name} saves {100 * measured:.0f} % of what a DP rank pays at its peak "
          f"(the formula's model states alone: {100 * formula:.0f} %)")
table.round(3)
"""),
        code("""
guess.reveal(100 * table.loc["ZeRO-3", "saving vs DP, measured"],
             'Less than half: the activations and the gathered layers in flight are not sharded.')
"""),
        md("""
The measured saving is smaller than the model-state formula's: activations are not partitioned, and
ZeRO-2/3 pay for the gradient copies in flight and ZeRO-3 for the gathered layers.

## The true peak: where a large vocabulary puts it

The snapshots are taken at phase boundaries, and the allocator's high-water mark can fall between two of them.
With `profile_memory=True` the profiled step records every allocation and free, so its **true peak** is measured
— the most the allocator held at any moment — with the categories in effect then (`true_peak` in summary.json).

For a large vocabulary and a small width (V = 32768, h = 64; 4 × 64 tokens a rank) the logits, b·s·V values, are
the step's largest tensors, and the peak falls at **the start of the loss's backward**: every activation is still
held (backward has released none yet), the logits are alive until the loss's backward returns, and that backward
allocates their gradient, as large, and an fp32 block of rows. The `loss` band is that moment — the loss reports
exactly those bytes at that instant (model/cross_entropy.py), and `formulas.loss_bytes` predicts them. Without the
band, that share of the peak would be named by nothing.
"""),
        code("""
WIDE_VOCABULARY = {"vocab_size": 32768, "seq_len": 64, "hidden": 64, "heads": 4, "layers": 2}
wide = wb.launch(wb.RunConfig(model=WIDE_VOCABULARY, dp=2, global_batch=8, steps=3, seed=0, profile_memory=True,
                              profile_memory_step=2), out=os.path.join(OUT, "wide_vocabulary"), force=True)
r0 = wide.summary["ranks"][0]
peak = r0["true_peak"]
at_peak = {k: v / 2**20 for k, v in peak["categories"].items() if v}
print(f"the true peak: {peak['allocated'] / 2**20:.1f} MiB; the categories then (MiB): "
      + ", ".join(f"{k} {v:.1f}" for k, v in at_peak.items()))
print(f"the loss's bytes: {peak['categories']['loss'] / peak['allocated']:.0%} of the peak "
      f"(measured {r0['peak_bytes']['loss'] / 2**20:.1f} MiB, predicted {r0['predicted_bytes']['loss'] / 2**20:.1f})")
measured = peak["allocated"] - peak["backend_threads"]
error = measured / r0["predicted_peak_total_bytes"] - 1
print(f"unattributed at the true peak: {peak['unattributed'] / 2**20:.2f} MiB "
      f"({peak['unattributed'] / peak['allocated']:.1%}); predicted peak {r0['predicted_peak_total_bytes'] / 2**20:.1f}"
      f" MiB, measured {measured / 2**20:.1f} ({error:+.1%}: the prediction leaves out Adam's step counters)")
viz.check("the categories explain the allocator's true peak within 1 %", "abs(unattributed) <= 0.01 * allocated",
          unattributed=peak["unattributed"], allocated=peak["allocated"])
viz.check("the true peak falls at the loss's backward (its bytes are in the categories then)",
          "loss_then == loss_peak", loss_then=peak["categories"]["loss"], loss_peak=r0["peak_bytes"]["loss"])
viz.check("the predicted peak is the measured one within 2 %", "abs(error) <= 0.02", error=error)
viz.memory_over_time(wide, rank=0, steps=1, first=2).show()
"""),
        md("""
Where the band sits in the chart: the forward's activations climb to their top, then — the first thing backward
does — the loss's bytes appear on top of them, and the allocator's true peak (the diamond) lands there; backward then
releases the activations layer by layer. The rise is 2·b·s·V values plus a block, so it grows with the micro-batch,
the sequence and the vocabulary, and not with the number of ranks: ZeRO does not shard it, tensor parallelism's
vocabulary-parallel loss divides it by t, and a smaller micro-batch is the usual cure. Before launch, the same
prediction refuses a run whose peak would not fit in the machine's free memory (docs/guide/reliability.md).

## ZeRO-3 over one step: the saw-tooth

Each layer's parameters are all-gathered just before its forward (the next one prefetched while it
computes), freed after, gathered again before its backward, and freed once its gradients are
reduce-scattered. `temporary` is the gathered layers; `parameter` stays at this rank's 1/N. On this
model the states dominate, so the stack shows it — and beneath it the gathered layers alone, one tooth
per layer in forward and again in backward:
"""),
        code("""
zero3 = runs["ZeRO-3"]
viz.memory_over_time(zero3, rank=0, steps=1).show()
"""),
        code("""
mem = zero3.memory[zero3.memory["rank"] == 0]
spans = zero3.events[(zero3.events["rank"] == 0) & (zero3.events.cat == "step")].sort_values("start_us")
one = mem[(mem.ts_us >= spans.start_us.iloc[1]) & (mem.ts_us <= spans.end_us.iloc[1])]
fig = px.line(one.assign(ms=(one.ts_us - one.ts_us.min()) / 1e3, MB=one.temporary / 1e6), x="ms", y="MB",
              line_shape="hv", labels={"ms": "time in step 1 (ms)", "MB": "gathered layers, 'temporary' (MB)"},
              title="ZeRO-3, rank 0: the full layers it holds for a moment — gathered, used, freed")
fig.show()
teeth = int(((one.temporary.diff() > 0)).sum())
layers = STATES_DOMINATE["layers"]
print(f"{teeth} rises of the gathered-layer memory in one step ({layers} layers, forward and backward)")
"""),
        md("""
## Communication: ZeRO-1 and 2 move what data parallelism moves, ZeRO-3 1.5 ×

An all-reduce is a reduce-scatter followed by an all-gather: ZeRO-1/2 reduce-scatter the gradients
and all-gather the updated parameters — 2Ψ values, like the all-reduce. ZeRO-3 gathers the parameters
twice (forward and backward) and reduce-scatters the gradients: 3Ψ. Bytes each rank sends per step:
"""),
        code("""
dp_bytes = runs["dp=2"].summary["ranks"][0]["bytes_moved_per_step"]
moved = pd.DataFrame([{"run": name, "bytes sent per step": r.summary["ranks"][0]["bytes_moved_per_step"],
                       "× data parallel": r.summary["ranks"][0]["bytes_moved_per_step"] / dp_bytes}
                      for name, r in runs.items() if r.config["dp"] == 2])
viz.check("ZeRO-3 moves 1.5× data parallelism's bytes",
          "abs(ratio - 1.5) < 0.01", ratio=moved.set_index("run").loc["ZeRO-3", "× data parallel"])
moved
"""),
        md("""
## ZeRO-3 prefetch: memory for time

ZeRO-3 gathers each layer's parameters just before it computes. With `prefetch` (the default, as
FSDP's forward and backward prefetch) the gather of the *next* layer is launched while this one
computes, so it can arrive in time — at the price of two gathered layers alive at once instead of one
(`temporary`).

A gather can only hide under compute if it takes time worth hiding. Between two processes on one machine
a gather of a tiny layer takes a fraction of a millisecond, less than the Python around it: measured so,
prefetch exposed *more* time than no prefetch, the bookkeeping of an early launch costing more than the
nothing it hid. So these two runs put the ranks on two emulated machines joined by a slow link (0.05 GB/s;
as in notebook 01, the link holds each message for bytes / bandwidth, which is the formula, not a
measurement), with an 8-layer model, so that each layer's gather lasts about as long as its compute, as it
does between GPU machines. **Exposed** here is the time rank 0's host stood blocked on communication: in a
blocking gather, or waiting for one in flight.
"""),
        code("""
EIGHT_LAYERS = {"hidden": 64, "layers": 8, "seq_len": 32}
SLOW = dict(model=EIGHT_LAYERS, dp=2, zero=3, global_batch=16, steps=6, seed=0, ranks_per_node=1,
            emulate_link="inter=0.05,0")
pair = {f"ZeRO-3, {name}": wb.launch(wb.RunConfig(prefetch=on, **SLOW), out=os.path.join(OUT, f"zero3-{name}-link"),
                                     force=True) for name, on in (("prefetch", True), ("no prefetch", False))}

def blocked_ms(r):  # rank 0's host blocked on communication, a step (the steps after the first)
    ev = r.events[(r.events["rank"] == 0) & (r.events.step >= 1)]
    blocked = ev[(ev.cat == "wait") | ((ev.cat == "collective") & (ev.kind == "span"))]
    return union_length(intervals(blocked)) / 1e3 / ev.step.nunique()

prefetch_table = pd.DataFrame({name: {
    "temporary peak (MB)": r.summary["ranks"][0]["peak_bytes"].get("temporary", 0) / 1e6,
    "total at once (MB)": r.summary["ranks"][0]["peak_total_bytes"] / 1e6,
    "exposed communication per step (ms)": blocked_ms(r),
    "median step (ms)": 1e3 * r.metrics.step_time_s.iloc[1:].median()} for name, r in pair.items()}).T
with_pf, without_pf = prefetch_table["exposed communication per step (ms)"]
viz.check("prefetching exposes less communication than gathering each layer when it is needed",
          "with_prefetch_ms < without_ms", with_prefetch_ms=with_pf, without_ms=without_pf,
          margin=viz.headroom(with_pf, without_pf), regime="dp 2 on 2 cores, 8 layers, emulated 0.05 GB/s link",
          timing="blocked time of two runs on shared cores")
viz.check("prefetching holds more gathered parameters at once",
          "with_prefetch_MB > without_MB", with_prefetch_MB=prefetch_table["temporary peak (MB)"].iloc[0],
          without_MB=prefetch_table["temporary peak (MB)"].iloc[1])
viz.check("the losses are the same with and without prefetch",
          "with_prefetch == without", with_prefetch=list(pair["ZeRO-3, prefetch"].metrics.loss),
          without=list(pair["ZeRO-3, no prefetch"].metrics.loss))
prefetch_table.round(3)
"""),
        md("""
The memory is exact and always there: one more gathered layer. The time saving needs a gather worth
hiding and something to hide it under: here the slow link gives the first, each layer's compute the second,
and prefetch cuts the blocked time and the step with it. On a GPU the all-gather runs on the network while
the SMs compute, as FSDP's and DeepSpeed's prefetch rely on.
"""),
        md("""
## ZeRO-Offload: the optimizer in host memory

ZeRO-Offload (Ren et al. 2021) moves each rank's slice of the fp32 master weights and of Adam's moments to
host memory, and runs the update there. The paper moves the fp16 gradients to the CPU as well, leaving 2Ψ (the
fp16 parameters) on the device. **This implementation keeps its gradient slice on the device** (it is reduced
there, then copied to the host for the update): its choice, which costs 2Ψ/N of device memory and keeps the
reduce-scatter on the device. In mixed precision ZeRO-2 so falls from 2Ψ + 14Ψ/N to (2 + 2/N)Ψ on the device
here, against the paper's 2Ψ. On this CPU the "host" copies are separate tensors — the same code a GPU
runs — so the trade is visible: the device's optimizer state goes to zero, the host holds 16Ψ/N, and the
losses are exactly ZeRO-2's.
"""),
        code("""
offload = run("zero2-offload", dp=2, zero=2, offload_optimizer=True)
viz.check("offload trains exactly as ZeRO-2", "offload == zero2", offload=list(offload.metrics.loss),
          zero2=list(runs["ZeRO-2"].metrics.loss))
s, base = offload.summary["ranks"][0], runs["ZeRO-2"].summary["ranks"][0]
viz.check("the optimizer states live on the host, as predicted",
          "host_bytes == predicted_host_bytes and device_optimizer_bytes == 0", host_bytes=s["host_peak_bytes"],
          predicted_host_bytes=s["predicted_host_bytes"], device_optimizer_bytes=s["peak_bytes"]["optimizer_state"])
STATES = ("parameter", "gradient", "optimizer_state")
pd.DataFrame({"ZeRO-2 (device)": {c: base["peak_bytes"][c] / 1e6 for c in STATES},
              "ZeRO-2 + offload (device)": {c: s["peak_bytes"][c] / 1e6 for c in STATES},
              "ZeRO-2 + offload (host)": {c: v / 1e6 for c, v in s["host_peak_bytes"].items()},
              "host, formula 16Ψ/N": {c: v / 1e6 for c, v in s["predicted_host_bytes"].items()}}).round(3)
"""),
        code("""
e = wb.estimate(wb.RunLayout(params=7.5e9, dp=64, zero=2, precision="mixed", offload=True))
print(f"the paper's 7.5 B on 64 GPUs, ZeRO-2 + offload: {e.model_state_bytes_per_rank / 1e9:.1f} GB per GPU "
      f"(= (2 + 2/64)Ψ), {sum(e.host_bytes.values()) / 1e9:.2f} GB per rank in host memory")
"""),
        md("""
Supported: ZeRO-1/2/3 over data parallelism, each with or without offload; ZeRO-1 beside pipeline
parallelism. Rejected before launch, with the reason: ZeRO with tensor parallelism, ZeRO-2/3 with
pipelines, ZeRO-3 with gradient accumulation, offload without ZeRO.
"""),
    ],
    "04_zero.ipynb",
)
