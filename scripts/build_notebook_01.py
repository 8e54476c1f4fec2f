"""Regenerates notebooks/01_data_parallel.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 1 · Data parallelism, for real

Every rank holds the **whole model** and takes **1/N of the global batch**. After backward the
gradients are averaged with an **all-reduce** over the N ranks, so every rank applies the same
update — the update one process would compute on the whole batch.

This notebook launches real multi-process runs (torchrun, gloo on this CPU; NCCL on a GPU machine),
then reads what every rank recorded:

1. the loss of 1, 2 and 4 ranks is the single-process loss, step by step;
2. **bucketing** lets the all-reduce of the last layers' gradients run *while backward is still
   computing the earlier layers* — the overlap is in the timeline;
3. the **ring all-reduce**, built from send/recv, step by step: 2(n−1) steps, each moving 1/n of the buffer;
4. **memory by category** per rank, measured beside the formula (4Ψ parameters + 4Ψ gradients + 8Ψ Adam in fp32).
"""),
        code("""
import os
import pandas as pd
import workbench as wb
from workbench import viz

OUT = os.path.join("..", "traces", "nb01")   # run directories: open any trace.json in https://ui.perfetto.dev
STEPS = 10

def run(name, **config):
    return wb.launch(wb.RunConfig(model="tiny", steps=STEPS, global_batch=16, seed=0, **config),
                     out=os.path.join(OUT, name), force=True)
"""),
        md("""
## 1. The same model on 1, 2 and 4 ranks

Same seed, same global batch of 16 sequences: with N ranks each rank trains on 16/N of them.
`bucket_mb` (megabytes per gradient bucket) is set small so that the tiny model's 0.12 MB of
gradients is cut into several buckets.
"""),
        code("""
runs = {
    "1 rank": run("dp1", dp=1),
    "2 ranks": run("dp2", dp=2, bucket_mb=0.01),
    "4 ranks": run("dp4", dp=4, bucket_mb=0.03),
    "2 ranks, ring all-reduce": run("dp2-ring", dp=2, allreduce="ring", bucket_mb=0.03),
    "4 ranks, ring all-reduce": run("dp4-ring", dp=4, allreduce="ring", bucket_mb=0.03),
}
table = viz.compare_losses(runs, baseline="1 rank")
table
"""),
        md("""
The differences are at the level of fp32 rounding (one unit in the last place of a loss near 4 is
about 5e-7): the gradient is summed in another order, nothing else changes. The test suite holds every
strategy to `|Δloss| ≤ 1e-5 · loss` (see `tests/test_data_parallel.py` for why that bound).
"""),
        code("""
viz.check("every run's losses equal one process's within 1e-5 × loss", "difference <= 1e-5 * loss",
          difference=table.max_abs_diff, loss=table.final_loss)
viz.loss_curves(runs, baseline="1 rank").show()
"""),
        md("""
**Why more ranks are slower here.** Each rank trains on 16/N sequences, yet the step gets longer with N on this
machine. The table below splits rank 0's step as its trace measured it: compute (forward, backward, optimizer),
communication, and the step. Two causes show in it. **Communication is most of the added time**: these runs
cut the tiny model's 0.12 MB of gradients into small buckets (0.01 and 0.03 MB) so that there are several, and
each bucket's all-reduce is a gloo call between processes. And **compute does not shrink** with a smaller share
of the batch: most of a tiny model's compute is the fixed cost of Python and autograd per layer, not
arithmetic, and with 2 and then 4 processes on two cores (each rank's gloo thread among them) a rank's compute
can grow. On GPUs, with a model whose compute is arithmetic and one device per rank, the same split shrinks
compute by N (notebook 07 measures speedup and efficiency).
"""),
        code("""
def split(r):
    s, timed = r.summary["ranks"][0], r.config["steps"] - r.summary["ranks"][0]["steps_excluded"]
    return {"ranks": r.config["dp"], "median step (ms)": 1e3 * r.metrics.step_time_s.iloc[1:].median(),
            "compute a step (ms)": 1e3 * s["compute_s"] / timed, "communication a step (ms)": 1e3 * s["comm_s"] / timed,
            "sequences a rank": 16 // r.config["dp"]}

pd.DataFrame({name: split(runs[name]) for name in ("1 rank", "2 ranks", "4 ranks")}).T.round(2)
"""),
        md("""
## 2. Overlap: bucketed all-reduce during backward

With one big bucket the all-reduce can only start when the *last* gradient is ready — after backward —
and all of it is exposed. With small buckets each bucket's all-reduce is launched the moment its
gradients are accumulated, and travels while backward computes the earlier layers. The naive way, one
blocking all-reduce per parameter after backward, exposes everything and pays a latency per tensor.

On this CPU an all-reduce of a few hundred kilobytes between two processes takes well under a
millisecond, far less than backward, so there is little to hide. On a real cluster the gradients are
gigabytes and the link between machines 25–50 GB/s: the all-reduce lasts about as long as backward.
To see that regime here, the ranks sit on two **emulated machines** joined by an emulated link
(`emulate_link`, a teaching device: each message is held for latency + bytes/bandwidth, the data are
untouched) sized so that the all-reduce of a model with 8 layers (1.6 MB of gradients) takes about as
long as its backward: 0.1 GB/s and 10 µs.

Rows per rank in the timelines: `compute` (forward, backward, optimizer), `comm` (launches and blocking
collectives), `comm in flight` (each bucket's all-reduce from launch to completion, its own colour),
`wait` (the host blocked on a handle: for the transfer, or for a slower peer).

Predict first: the box below asks for one number, and the table after the runs says how far off it was.
"""),
        code("""
guess = viz.predict('The naive way all-reduces each parameter tensor on its own, blocking, after backward: about a '
                    'hundred all-reduces a step for this 8-layer model, where one bucket sends the same bytes in one '
                    "or two. How many times one bucket's exposed time will naive expose?", unit='×')
guess
"""),
        code("""
from workbench.predict.estimator import estimate, with_emulated_links

EIGHT_LAYERS = {"hidden": 64, "layers": 8, "seq_len": 32}
LINK = dict(ranks_per_node=1, emulate_link="inter=0.1,10")   # two emulated machines, 0.1 GB/s, 10 µs
hw = wb.calibrate("tiny", worlds=(2, 4), repeats=1, out=os.path.join("..", "traces", "calibration"), reuse=True)
ways = {"naive (per tensor, after backward)": dict(dp_impl="naive"),
        "one bucket (25 MB)": dict(bucket_mb=25), "four buckets (0.4 MB)": dict(bucket_mb=0.4)}
overlap_runs, rows, spreads = {}, {}, {}
for name, way in ways.items():
    c = dict(model=EIGHT_LAYERS, dp=2, global_batch=16, **LINK, **way)
    r = overlap_runs[name] = wb.launch(wb.RunConfig(steps=STEPS, seed=0, **c),
                                       out=os.path.join(OUT, "overlap-" + name.split()[0]), force=True)
    cfg = wb.RunConfig(**c)
    est = estimate(cfg, hardware=with_emulated_links(hw, cfg))
    s = r.summary["ranks"][0]
    timed = STEPS - s["steps_excluded"]          # the summary's times are totals over the timed steps
    ev = r.events                                # exposed: each rank's host blocked in "gradient sync";
    sync = ev[(ev.name == "gradient sync") & (ev.step >= 1)].dur_us   # the median over ranks and steps
    grads = ev[(ev["rank"] == 0) & (ev.step >= 1) & (ev.cat == "collective") & (ev.group == "dp")]
    spreads[name] = (sync.quantile(0.1) / 1e3, sync.quantile(0.9) / 1e3)
    rows[name] = {"exposed gradient sync per step, measured (ms)": sync.median() / 1e3,   # (one slow step
                  "predicted (ms)": 1e3 * est.step_terms["dp"],   # on a shared core moves a mean, not this)
                  "all-reduces a step": len(grads) / grads.step.nunique(),
                  "ms an all-reduce (measured)": grads.dur_us.mean() / 1e3,
                  "hidden under backward per step (ms)": 1e3 * s["overlap_s"] / timed,
                  "median step (ms)": 1e3 * r.metrics.step_time_s.iloc[1:].median(),
                  "predicted step (ms)": 1e3 * est.step_time_s}
exposed = pd.DataFrame(rows).T
same = viz.compare_losses(overlap_runs, baseline="four buckets (0.4 MB)")
viz.check("naive, one bucket and four buckets train the same model (within 1e-5 × loss)",
          "difference <= 1e-5 * loss", difference=same.max_abs_diff, loss=same.final_loss)
one, four = exposed.iloc[1, 0], exposed.iloc[2, 0]
viz.check("under a link as slow as backward, small buckets expose less communication than one bucket",
          "four_buckets_ms < one_bucket_ms", four_buckets_ms=four, one_bucket_ms=one, margin=viz.headroom(four, one),
          regime="dp 2 on 2 cores, 8 layers, emulated 0.1 GB/s link",
          timing="exposed time of two runs on shared cores (the link's hold is the emulator's formula)")
exposed["error %"] = 100 * (exposed["predicted (ms)"] / exposed.iloc[:, 0] - 1)
naive = exposed.iloc[0]
print(f"naive: {naive['all-reduces a step']:.0f} blocking all-reduces a step, one per parameter tensor, each "
      f"{naive['ms an all-reduce (measured)']:.2f} ms as rank 0's trace measured it (the link's hold, the gloo "
      f"call, and the wait for the other rank to reach the same tensor) — the estimate prices the gradients' "
      f"bytes and one latency a bucket, not a blocking call per tensor: the count × that time is the miss "
      f"({naive['error %']:+.0f} %)")
for name, row in exposed.iloc[1:].iterrows():
    low, high = spreads[name]
    if abs(row["error %"]) > 25:
        inside = low <= row["predicted (ms)"] <= high
        print(f"{name}: {row['error %']:+.0f} % — its steps' exposed time ranged {low:.1f}–{high:.1f} ms (10th–90th "
              f"percentile): the prediction lies {'inside' if inside else 'outside'} that spread"
              + (", so this machine's step-to-step noise covers the gap" if inside else ""))
exposed.round(1)
"""),
        code("""
guess.reveal(exposed.iloc[0, 0] / exposed.iloc[1, 0],
             "Naive makes a blocking call per tensor, and each costs about the same whatever its bytes (the line "
             "above the table says how much): the count, not the bytes, sets its time.")
"""),
        code("""
viz.timeline(overlap_runs["one bucket (25 MB)"], title="one bucket: its all-reduce starts when backward is over, "
             "and all of it is exposed").show()
viz.timeline(overlap_runs["four buckets (0.4 MB)"], title="0.4 MB buckets: all but the last travel while backward "
             "computes the earlier layers").show()
"""),
        md("""
The bucket size is a trade-off. Each bucket pays the link's latency and a fixed cost of launching a
collective; the last bucket (the first layers' gradients, the embedding among them) can only start when
backward ends, and stays exposed. The control below predicts the exposed communication for any bucket
size under the same emulated link, with the three measurements as markers: too large and nothing
overlaps, too small and the fixed costs add up. DDP's default, 25 MB, is sized for GPUs and gigabytes of
gradients.
"""),
        code("""
import ipywidgets as widgets
import plotly.graph_objects as go

SIZES_MB = [0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 25]

def exposed_at(mb):
    cfg = wb.RunConfig(model=EIGHT_LAYERS, dp=2, global_batch=16, bucket_mb=mb, **LINK)
    return 1e3 * estimate(cfg, hardware=with_emulated_links(hw, cfg)).step_terms["dp"]

curve = [exposed_at(mb) for mb in SIZES_MB]

def bucket_chart(bucket_mb=0.4):
    fig = go.Figure(go.Scatter(x=SIZES_MB, y=curve, mode="lines", name="predicted exposed comm",
                               line={"dash": "dot", "color": "#E45756"}))
    fig.add_trace(go.Scatter(x=[0.4, 25], y=[four, one], mode="markers", name="measured",
                             marker={"size": 11, "color": "#E45756"}))
    fig.add_trace(go.Scatter(x=[bucket_mb], y=[exposed_at(bucket_mb)], mode="markers+text", name="chosen",
                             text=[f"{exposed_at(bucket_mb):.1f} ms"], textposition="top center",
                             marker={"size": 14, "symbol": "diamond", "color": "black"}))
    fig.update_layout(xaxis={"type": "log", "title": "bucket size (MB, log)"}, height=380,
                      yaxis={"title": "exposed DP communication per step (ms)", "rangemode": "tozero"},
                      title="bucket size under the emulated link (0.1 GB/s, 10 µs): prediction and measurements")
    fig.show()

widgets.interact(bucket_chart, bucket_mb=widgets.SelectionSlider(options=SIZES_MB, value=0.4, description="bucket MB"));
"""),
        md("""
**The CPU side of the trade-off.** Without the emulated link, on these two shared cores, the same
comparison on the `tiny` model goes the other way: a dozen 10 kB all-reduces each pay a fixed cost that
dwarfs their transfer, and the ranks and gloo's threads share the cores — small buckets make the step
*slower*. That is the latency side: when communication is cheap next to its fixed cost, fewer, bigger
messages win.
"""),
        code("""
one_bucket = run("dp2-one-bucket", dp=2, bucket_mb=25)
small_buckets = runs["2 ranks"]
pd.concat({"one bucket": viz.overlap_table(one_bucket), "small buckets (0.01 MB)": viz.overlap_table(small_buckets)})
"""),
        md("Step through the steps of the small-bucket run under the emulated link:"),
        code("""
from workbench.viz.widgets import timeline_explorer
timeline_explorer(overlap_runs["four buckets (0.4 MB)"])
"""),
        md("""
## 3. The ring all-reduce, step by step

`allreduce="ring"` replaces the backend's all-reduce with ours, written from send/recv. Each bucket
is cut into n chunks. In the **reduce-scatter** phase (n−1 steps) each rank sends one chunk to its
right neighbour and adds the chunk arriving from its left; afterwards each rank holds one chunk summed
over all ranks. In the **all-gather** phase (n−1 steps) the finished chunks travel round the ring.
Every rank sends 2(n−1)/n of the buffer in total: under 2 S whatever n is, so the bandwidth term
hardly grows with n — but the 2(n−1) steps each pay a latency α, so the latency term 2(n−1)·α grows
linearly with n (many ranks and small buffers: latency-bound).

The chart replays one recorded all-reduce of the 4-rank run: each cell shows how many ranks'
contributions that chunk holds on that rank; arrows are the transfers of the step (from the spans' args).
"""),
        code("""
from workbench.viz.ring import replay

ring4 = runs["4 ranks, ring all-reduce"]
viz.ring_steps(ring4).show()
ev = ring4.events
steps = ev[ev.cat == "ring_step"]
last_step = steps[steps.step == steps.step.max()]
states = replay(last_step[last_step.seq == last_step.seq.min()], 4)   # one all-reduce, step by step
viz.check("the replay: 2(n−1) = 6 steps; after the reduce-scatter's 3 each rank holds one chunk summed over all 4 "
          "ranks, after the all-gather's 3 every chunk everywhere",
          "steps == 6 and list(after_reduce_scatter) == [4, 4, 4, 4] and all(after_all_gather == 4)",
          steps=len(states) - 1, after_reduce_scatter=sorted(max(len(c) for c in row) for row in states[3]),
          after_all_gather=[min(len(c) for c in row) for row in states[-1]])
viz.ring_all_reduces(ring4).head()
"""),
        md("""
Bus bandwidth of each bucket's all-reduce, ours against the backend's (nccl-tests' definition:
busbw = S/t · 2(n−1)/n). Tiny buckets are latency-bound on any transport; `benchmarks/dp_vs_ddp.py`
measures large ones.
"""),
        code("""
from workbench.analysis.collectives import bandwidth_by_size

pd.concat({"backend (gloo), GB/s": bandwidth_by_size(runs["4 ranks"]),
           "ring (ours), GB/s": bandwidth_by_size(ring4)}, axis=1)
"""),
        md("""
## 4. Memory by category

Each rank counts the bytes it really holds — parameters, gradients (the buckets), Adam's two moments,
activations saved for backward (added as forward saves them, released as backward consumes them) — at
phase boundaries. Data parallelism replicates all of it: 16Ψ bytes of model states per rank in fp32,
whatever N is. (ZeRO, later, divides it by N.)

The run below is launched with `profile_memory=True`: torch.profiler's memory events give what the CPU
allocator really held at each snapshot of step 1. The dotted line is the allocator; the hatched band,
`unattributed`, is what it held beyond the categories (the input batch, a layer's short-lived
intermediates) — shown, not hidden; where the backend's own threads allocated (gloo's all-gather
buffers, under ZeRO-3) the profile measures that too and a dotted band shows it. The bar chart's black line is the
simultaneous total: the categories peak at different moments, so what a rank pays at once is less than
the stack of their peaks.
"""),
        code("""
dp2 = runs["2 ranks"]
profiled = run("dp2-profiled", dp=2, profile_memory=True, profile_memory_step=1)
viz.memory_breakdown(profiled).show()
viz.memory_over_time(profiled, rank=0, steps=2).show()
r = profiled.summary["ranks"][0]
print(f"simultaneous peak of the categories: {r['peak_total_bytes'] / 1e6:.3f} MB; allocator peak: "
      f"{r['allocator_peak_bytes']['allocated'] / 1e6:.3f} MB; unattributed at that peak: "
      f"{r['unattributed_bytes'] / 1e6:.3f} MB; the categories explained at least "
      f"{100 * r['attributed_share_min']:.0f} % of the allocator at every snapshot")
"""),
        code("""
psi = dp2.config["params"]
r0 = dp2.summary["ranks"][0]
by_cat = pd.DataFrame({"measured peak": r0["peak_bytes"], "predicted": r0["predicted_bytes"]}).dropna()
by_cat["predicted"] = by_cat["predicted"].round().astype(int)  # bytes: whole numbers, as measured
by_cat["formula"] = pd.Series({"parameter": "4Ψ", "gradient": "4Ψ", "optimizer_state": "8Ψ (Adam m, v)",
                              "activation": "tensors saved for backward"}).reindex(by_cat.index).fillna("—")
print(f"Ψ = {psi:,} parameters")
viz.check("every category's measured peak equals its formula, to the byte",
          "measured == predicted", measured=by_cat["measured peak"], predicted=by_cat["predicted"])
by_cat
"""),
        md("""
## Open the traces

Every run directory holds `trace_rank{r}.json` per rank and the merged `trace.json`: drop it on
<https://ui.perfetto.dev> to see the same lanes, the all-reduce flows and the memory counters.
"""),
        code("""
print(os.path.abspath(dp2.path))
sorted(os.listdir(dp2.path))
"""),
    ],
    "01_data_parallel.ipynb",
)
