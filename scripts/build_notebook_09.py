"""Regenerates notebooks/09_communication.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 9 · Communication: the four primitives, compression, hierarchy — and why DP is bandwidth-bound, PP latency-bound

Every parallel strategy is, underneath, a pattern of messages. This notebook takes the subject of
communication apart: the four collectives as rings of send/recv (replayed from what the ranks recorded),
what one all-reduce costs (α and β, measured), gradient compression (16-bit buckets, and 1-bit Adam), the
hierarchical all-reduce, and why data parallelism suffers from a thin pipe and pipeline parallelism from a
long one. The last two need machines joined by a slower link: where this machine can make a **local
cluster** (root and iproute2: nodes as network namespaces, their links shaped by the kernel, `workbench
cluster`) they run across a real wire; elsewhere across an **emulated network**, a teaching device, and the
notebook says which it used.
"""),
        code("""
import os
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
import workbench as wb
from workbench import viz
from workbench.trace.spans import comm_intervals
from workbench.trace.bandwidth import bytes_sent
from workbench.predict.estimator import estimate, with_emulated_links
from workbench.launching.launcher import ring_demo
from workbench.viz.ring import ring_collectives

OUT = os.path.join("..", "traces", "nb09")

def run(name, **config):
    config = {"model": "tiny", "global_batch": 8, "seed": 0, "steps": 6, **config}
    return wb.launch(wb.RunConfig(**config), out=os.path.join(OUT, name), force=True)

from workbench.launching.local_cluster import LocalCluster
from workbench.studies import wire

def can_make_a_cluster():   # network namespaces need root and iproute2
    try:
        LocalCluster(name="across", nodes=2, ranks_per_node=1).up().down()
        return True
    except (wb.ConfigError, RuntimeError) as e:
        print(f"No local cluster here ({e}): the hierarchical and DP-against-PP sections use the emulated link.")
        return False

ON_CLUSTER = can_make_a_cluster()
print("the slow link below:", "a real one (a local cluster)" if ON_CLUSTER else "emulated")
"""),
        md("""
## The four primitives, as rings

`ring_demo` starts four processes with torchrun and runs each of our ring collectives once — all-reduce,
reduce-scatter, all-gather, broadcast from rank 0 — on a buffer of 12 values (3 per rank), checking each
against gloo's own collective. Every ring step is a traced span; the charts below replay them. For the
reducing ops a cell says how many ranks' contributions the chunk holds; for the copying ones, whether it
has arrived. The title compares the bytes the busiest rank sent with the formula: 2(N−1)/N·S for the
all-reduce — which *is* a reduce-scatter followed by an all-gather, (N−1)/N·S each — and S for a broadcast.
"""),
        code("""
from workbench.viz.ring import SENT, replay

demo = ring_demo(ranks=4, numel=3, out=os.path.join(OUT, "ring-demo"), force=True)
table = ring_collectives(demo)
ev, full, ends, busiest, formula = demo.events, {0, 1, 2, 3}, {}, {}, {}
for row in table.itertuples():   # each replayed to its end, and the busiest rank's bytes against the formula
    steps = ev[(ev.cat == "ring_step") & (ev.seq == row.seq)]
    last = replay(steps, 4, row.op, source=0)[-1]
    ends[row.op] = (all(last[r][r] == full for r in range(4)) if row.op == "reduce_scatter" else
                    all(c == full for rank in last for c in rank) if row.op == "all_reduce" else
                    all(c for rank in last for c in rank))
    busiest[row.op], formula[row.op] = steps.groupby("rank").bytes.sum().max(), SENT[row.op](4) * row.bytes
viz.check("every ring ends where its collective does: all-reduce every chunk summed everywhere, reduce-scatter "
          "chunk i summed on rank i, all-gather and broadcast every chunk everywhere",
          "all_reduce and reduce_scatter and all_gather and broadcast", **ends)
viz.check("the busiest rank sent the formula's bytes in each", "busiest == formula", busiest=list(busiest.values()),
          formula=list(formula.values()))
table
"""),
        code("""
for op in ("reduce_scatter", "all_gather", "all_reduce", "broadcast"):
    viz.ring_steps(demo, op=op).show()
"""),
        md("""
## α and β: what one all-reduce costs

Every collective is costed the same way: a fixed **latency α** per message, plus the bytes over the
**bandwidth β**. A ring all-reduce of S bytes over n ranks takes 2(n−1) steps and sends 2(n−1)/n·S bytes
from each rank, so

  t(S) = 2(n−1)·α_step + 2(n−1)/n · S/β,

written below as t = α + 2(n−1)/n·S/β with α the whole latency of the collective. Below the size
**α·β** (the crossover, marked) latency dominates and bigger messages come almost free; above it the
time grows with S. Predict first, in the box below; then the measurement: all-reduces of 1 KB to 64 MB
on 2 and on 4 ranks (the clock, the fastest of 6 after a barrier: the model's α and β are what the link and
the algorithm cost, and on a shared machine any one call can lose a time slice to something else — a median
of so few still moved the fit by 40 % from one run to the next here), with the fit.
"""),
        code("""
guess = viz.predict("Where does the crossover α·β of gloo's all-reduce on 2 ranks lie on this machine, in kilobytes?",
                    unit=" kB")
guess
"""),
        code("""
from workbench.studies.comm_calibration import allreduce_times, alpha_beta

SIZES = tuple(1 << k for k in range(10, 27, 2))          # 1 KB … 64 MB
fits, ab = {}, []
for n in (2, 4):
    times = allreduce_times(SIZES, world=n, repeats=8, stat="min")
    a, b = alpha_beta(times, n)
    fits[n] = (a, b)
    for size, t in times.items():
        model = a + 2 * (n - 1) / n * size / b
        ab.append({"ranks": n, "bytes": size, "measured (ms)": 1e3 * t, "fit (ms)": 1e3 * model,
                   "relative residual": (t - model) / model, "bytes sent per rank": 2 * (n - 1) / n * size,
                   "ring steps": 2 * (n - 1)})
ab = pd.DataFrame(ab)
fig = make_subplots(rows=1, cols=2, subplot_titles=("all-reduce time against size (log–log)",
                                                    "bytes each rank sends, per byte of buffer"))
for n, color in ((2, "#4C78A8"), (4, "#F58518")):
    d = ab[ab.ranks == n]
    a, b = fits[n]
    fig.add_trace(go.Scatter(x=d.bytes, y=d["measured (ms)"], mode="markers", name=f"n = {n} measured",
                             marker={"color": color}), row=1, col=1)
    fig.add_trace(go.Scatter(x=d.bytes, y=d["fit (ms)"], mode="lines", line={"color": color, "dash": "dot"},
                             name=f"n = {n} fit: α = {1e6 * a:.0f} µs, β = {b / 1e9:.2f} GB/s"), row=1, col=1)
    fig.add_vline(x=a * b, line_dash="dash", line_color=color, row=1, col=1)
    fig.add_trace(go.Bar(x=[f"n = {n}"], y=[2 * (n - 1) / n], marker_color=color, showlegend=False,
                         text=[f"{2 * (n - 1)} steps"], textposition="outside"), row=1, col=2)
fig.update_xaxes(type="log", title_text="bytes (dashed: the crossover α·β)", row=1, col=1)
fig.update_yaxes(type="log", title_text="ms", row=1, col=1)
fig.update_yaxes(range=[0, 2.2], title_text="2(n−1)/n", row=1, col=2)
fig.update_layout(height=420, title="measured all-reduces on this machine (gloo), with t = α + 2(n−1)/n·S/β")
fig.show()
median_residual = ab["relative residual"].abs().median()
viz.check("the α–β line fits the measured all-reduces (median |residual| under 35 %)", "median_residual < 0.35",
          median_residual=median_residual, crossover_n2_kB=fits[2][0] * fits[2][1] / 1e3,
          margin=viz.headroom(median_residual, 0.35), regime="2 and 4 ranks on 2 cores, gloo",
          timing="timed all-reduces on shared cores")
ab.pivot(index="bytes", columns="ranks", values=["measured (ms)", "fit (ms)"]).round(3)
"""),
        code("""
guess.reveal(fits[2][0] * fits[2][1] / 1e3,
             "Below it a message costs about α whatever its size; above it, about its bytes over β.")
"""),
        md("""
The right panel is the ring's claim: each rank sends 2(n−1)/n of the buffer — 1× at n = 2, 1.5× at
n = 4, never above 2× however many ranks — so on links that each rank has to itself, the bandwidth
term hardly grows with n. The latency term does: 2 steps at n = 2, 6 at n = 4, 2(n−1) in general.

Where the claim stops holding, and it does here: four ranks on this machine's two cores share the cores
and the memory bus, so each rank's "link" gets slower as n grows (compare the two β). On a GPU machine
with NVSwitch, or across machines each with its own network card, the per-rank bandwidth is the rank's
own and the claim holds; on a shared PCIe switch or a shared network uplink it does not. And for
messages below α·β, the 2(n−1) latencies dominate: many ranks and small buffers are latency-bound.

Real magnitudes, for scale (per GPU, one direction; latencies are NCCL's small-message all-reduce):

| link | bandwidth | latency |
|---|---|---|
| NVLink 3 (A100, through NVSwitch) | 300 GB/s | ≈ 5–10 µs |
| NVLink 4 (H100) | 450 GB/s | ≈ 5–10 µs |
| PCIe 4.0 x16 | 32 GB/s | ≈ 10 µs |
| InfiniBand HDR / NDR, one port | 25 / 50 GB/s | ≈ 2 µs per hop, ≈ 15–30 µs per small collective |
| 100 Gb Ethernet | 12.5 GB/s | ≈ 20–50 µs |
| gloo on this machine (above) | the fitted β | the fitted α |
"""),
        md("""
## Compressing the gradients

Three runs of the same model and batch on two ranks: fp32 buckets; buckets cast to bf16 for the
all-reduce and back (torch DDP's `bf16_compress_hook`); and 1-bit Adam (Tang et al. 2021), which after a
warm-up of plain Adam freezes the variance and all-reduces the *momentum* as signs plus one scale per
chunk, with the rounding error fed back into the next step. The bytes are read from each run's trace.
"""),
        code("""
STEPS, WARMUP = 20, 6
full = run("fp32", dp=2, steps=STEPS)
half = run("bf16", dp=2, steps=STEPS, grad_compression="bf16")
onebit = run("onebit", dp=2, steps=STEPS, optimizer="onebit-adam", onebit_warmup_steps=WARMUP)

def gradient_bytes(r, step):
    trace = next(t for t in r.traces if t["distributedInfo"]["rank"] == 0)
    ops = [a for a, _, _ in comm_intervals(trace["traceEvents"])]  # each operation once
    return sum(bytes_sent(a) for a in ops if a.get("step") == step
               and str(a.get("label", "")).startswith(("bucket", "onebit signs", "onebit scales")))

sent = {name: gradient_bytes(r, 15) for name, r in (("fp32", full), ("bf16", half), ("onebit", onebit))}
viz.check("bf16 buckets send exactly half the fp32 buckets' bytes (measured)", "2 * bf16 == fp32",
          bf16=sent["bf16"], fp32=sent["fp32"])
viz.check("after its warm-up 1-bit Adam sends 1/32 of fp32's bytes (+ its scales, < 10 %)",
          "1 / 32 <= ratio <= 1.1 / 32", ratio=sent["onebit"] / sent["fp32"])
viz.check("1-bit Adam's warm-up is AdamW: the same losses, bit for bit",
          "onebit == adamw", onebit=list(onebit.metrics.loss[:WARMUP + 1]),
          adamw=list(full.metrics.loss[:WARMUP + 1]))
pd.DataFrame({
    "bytes sent per step (measured)": list(sent.values()),
    "predicted": [estimate(wb.RunConfig(dp=2)).comm_bytes_per_step["dp"],
                  estimate(wb.RunConfig(dp=2, grad_compression="bf16")).comm_bytes_per_step["dp"],
                  estimate(wb.RunConfig(dp=2, optimizer="onebit-adam")).comm_bytes_per_step["dp"]],
    "median step (ms)": [1e3 * r.metrics.step_time_s.iloc[1:].median() for r in (full, half, onebit)],
    "final loss": [r.metrics.loss.iloc[-1] for r in (full, half, onebit)],
}, index=["fp32 buckets", "bf16 buckets", f"1-bit Adam (after its {WARMUP}-step warm-up)"])
"""),
        md("""
The predictions use `tiny`'s Ψ like the runs. bf16 halves the bytes exactly and trains the same curve to
the eye. 1-bit Adam sends 1/32 of the fp32 all-reduce after its warm-up (the warm-up steps are Adam
itself, bit for bit). Its loss keeps falling, but on this small model and so few compressed steps it
ends above Adam's; the gap is the compression (with the exact mean instead of signs, frozen-variance Adam
ends slightly *below* Adam here). The paper's claim — Adam's convergence — is for long runs of large
models, where the error feedback has time to even out; on a CPU we can show the mechanism, not that scale.
"""),
        code("""
viz.loss_curves({"Adam, fp32 buckets": full, "Adam, bf16 buckets": half, "1-bit Adam": onebit},
                baseline="Adam, fp32 buckets").show()
"""),
        md("""
## Hierarchical all-reduce under a slow link between machines

Two machines of two ranks each, a slow link between them. The flat ring's every step waits for the pair of
ranks that crosses machines; the hierarchical all-reduce reduce-scatters inside each machine, all-reduces
only a K-th of the buffer across, and all-gathers inside again.

**On a local cluster** (where this machine can make one) the machines are two network namespaces and the
link is real: each node's one link to the switch is shaped by the kernel's token-bucket filter (tbf) at
200 Mbit/s each way, and the two ranks inside a node talk over its loopback. Times are the clock's, bytes
the shaper's own count. The model is `small` cut to 2 layers: 7.4 MB of gradients, so that the wire is
most of the all-reduce. What decides the time is what each node's link carries each way. The flat ring
of n = 4 ranks enters and leaves each node once: 2(n−1)/n · S = 1.5 S out of each node and 1.5 S in. The
hierarchical's two inter-node all-reduces (one per rank of the node, S/K = S/2 each, m = 2 machines) cross
the same link together: K · 2(m−1)/m · S/K = 2(m−1)/m · S = S. The formula's ratio for a shared link is
therefore 1.5. Per *rank*, the hierarchical sends K = 2 times fewer bytes still (3× in all), which is the
ratio where every rank has a link of its own to the other machine; here the two share one.

**Elsewhere** the link is **emulated**, a teaching device: two emulated machines of two ranks each
(`ranks_per_node=2`) and `--emulate-link 'inter=0.001,50;intra=2,5'`, which is 1 MB/s and 50 µs across
machines, 2 GB/s and 5 µs inside. These are not real magnitudes (InfiniBand moves 25–50 GB/s, NVLink
300–450 GB/s). They are scaled down so that the tiny model's 0.1 MB of gradients meets the same *ratio* of
inside to across (here 2000×; NVLink against one InfiniBand port is ≈ 10×, against Ethernet ≈ 30×, and a
CPU's compute is slow too): exaggerated on purpose, so that the effect shows above this machine's noise.
The traced communication layer holds each message for latency + bytes/bandwidth on the sending side
(the data are untouched: both runs equal one process) and marks the held time `emulated` in the trace;
the estimate beside each uses this machine's calibrated rates with the emulated links added
(`with_emulated_links`). The emulator gives each rank a link of its own.
"""),
        code("""
hw = wb.calibrate("tiny", worlds=(2, 4), repeats=1, out=os.path.join("..", "traces", "calibration"), reuse=True)
WIRE = {"base": "small", "layers": 2}     # 1.86 M parameters: a 7.4 MB gradient all-reduce, in one bucket
if ON_CLUSTER:
    with LocalCluster(name="allreduce", nodes=2, ranks_per_node=2, rate_mbit=200) as c:
        schemes = wire.allreduce_schemes(c, wb.RunConfig(model=WIRE, dp=4, global_batch=8, steps=4, seed=0),
                                         out=os.path.join(OUT, "cluster-allreduce")).set_index("scheme")
    hier = wb.load(schemes.loc["hierarchical", "run"])
    sent, formula = schemes["bytes out of node 0 (shaper)"], schemes["formula's bytes per node link"]
    t = schemes["measured all-reduce (ms)"]
    viz.check("node 0's link carried the formula's ratio of bytes, flat ring to hierarchical (1.5, within 3 %)",
              "abs(sent_ratio / formula_ratio - 1) < 0.03", sent_ratio=sent.ring / sent.hierarchical,
              formula_ratio=formula.ring / formula.hierarchical,
              regime="dp 4 as 2 cluster nodes × 2 ranks, 200 Mbit/s tbf, small (2 layers)")
    time_ratio, formula_ratio = t.ring / t.hierarchical, formula.ring / formula.hierarchical
    viz.check("the hierarchical all-reduce beats the flat ring by the formula's ratio, within 20 %",
              "abs(time_ratio / formula_ratio - 1) < 0.2", time_ratio=time_ratio, formula_ratio=formula_ratio,
              margin=viz.headroom(abs(time_ratio / formula_ratio - 1), 0.2),
              regime="dp 4 as 2 cluster nodes × 2 ranks, 200 Mbit/s tbf, small (2 layers)",
              timing="all-reduces of 4 ranks on 2 shared cores; tests/test_cluster_wire.py asserts it")
    intra_ms = 1e3 * wire.group_seconds(hier).get("dp_intra", 0.0)
    print(f"bytes out of node 0 over the formula's: {sent.ring / formula.ring:.3f} (ring), "
          f"{sent.hierarchical / formula.hierarchical:.3f} (hierarchical): the headers")
    print(f"ring / hierarchical: time {time_ratio:.2f}, {time_ratio / formula_ratio - 1:+.0%} off the formula's "
          f"{formula_ratio:.2f}; the hierarchical's two intra-node phases took {intra_ms:.0f} ms of its "
          f"{t.hierarchical:.0f} ms, whose bytes on the wire over the rate are {sent.hierarchical * 8 / 200e3:.0f} ms")
    table = schemes.drop(columns="run")
else:
    LINKS = "inter=0.001,50;intra=2,5"
    two_by_two = dict(dp=4, ranks_per_node=2, bucket_mb=0.03, emulate_link=LINKS)
    rows = {}
    for algo in ("ring", "hierarchical"):
        r = run(f"{algo}-emulated", allreduce=algo, **two_by_two)
        c = wb.RunConfig(model="tiny", global_batch=8, allreduce=algo, **two_by_two)
        est = estimate(c, hardware=with_emulated_links(hw, c))
        measured = r.metrics.step_time_s.iloc[1:].median()
        ev = r.events[r.events["rank"] == 0]   # the link's holds carry no step: every step's, over the run's steps
        rows[algo] = {"measured step (ms)": 1e3 * measured, "predicted step (ms)": 1e3 * est.step_time_s,
                      "error": f"{(est.step_time_s - measured) / measured:+.0%}",
                      "link's holds a step, rank 0 (ms)": ev[ev.cat == "emulated"].dur_us.sum() / 1e3 / len(r.metrics),
                      "estimate's DP term (ms)": 1e3 * est.step_terms["dp"],
                      "bytes across machines, per rank (predicted)": est.dp_link_bytes["inter"],
                      "bytes inside a machine, per rank (predicted)": est.dp_link_bytes["intra"]}
        if algo == "hierarchical":
            hier = r
    flat_ms, hier_ms = rows["ring"]["measured step (ms)"], rows["hierarchical"]["measured step (ms)"]
    # the claim itself is checked on a real wire (above, where a cluster can be made: CI's machines); here, the
    # emulator's holds are its formula, so the ratio is shown, not checked
    print(f"flat ring / hierarchical step: {flat_ms / hier_ms:.2f} (emulated link, where each rank has a link of "
          f"its own: the formula's ratio of bytes across per rank is 3)")
    table = pd.DataFrame(rows).T
table
"""),
        md("""
**Reading the table.** On the cluster, each scheme's all-reduce is timed from the trace (from the last rank
entering it to the last leaving it: one bucket, after backward, nothing hidden), beside the bytes node 0's
shaper let out a step and the formula's bytes per node link. The shaper's bytes exceed the formula's by the
headers (printed above: Ethernet, IP and TCP headers on every segment, and the acknowledgements of the
other way's data), alike for both schemes, so the ratio of bytes is the formula's. The ratio of times is
printed beside the formula's with what the hierarchical's two intra-node phases took: they are not free on
two shared cores. At 1 Gbit/s the wire's part shrinks five times while those phases do not, and the ratio
fell to 1.1–1.4 in the runs docs/formulas.md reports ("On a real wire").

Under emulation the error column says how far each estimate is from its step, and the two columns beside
it say where to look: the emulated link's holds that rank 0's trace recorded a step (what the link's
formula gives for the bytes it really sent) against the estimate's data-parallel term. Where the two agree,
the estimate's communication is right and its miss is elsewhere (compute stretched by four ranks on two
cores); where they differ, the estimate prices the link's traffic otherwise than the run sent it.

Either way the point of the section holds: the hierarchical all-reduce sends a K-th of the bytes across per
rank (each rank's 2(m−1)/m · S/K against the flat ring's 2(n−1)/n · S: a third here), two thirds of the flat
ring's through each node's one shared link (the 1.5 measured above), and its all-reduce is the shorter.
"""),
        code("""
viz.timeline(hier, steps=[2]).show()
"""),
        md("""
## Bandwidth-bound DP, latency-bound PP

Each strategy on two machines (one rank each), its step time as the link between them gets thinner (lower
bandwidth) and longer (higher latency). The extremes, 5 MB/s and 5 ms, are three to four orders of magnitude off a
real InfiniBand link (50 GB/s, a few µs): they are what makes a 0.1 MB model on a CPU, whose step already
takes milliseconds, feel the link the way a multi-gigabyte model feels a real one.

**Where a local cluster can be made** the thinner pipe is real: two nodes of one rank each, their links
shaped by tbf at 160 and 40 Mbit/s (0.02 and 0.005 GB/s), and the link's time a step is the bytes node 0's
shaper let out over the rate (its latency is not shaped: α across it measured 0.1–0.3 ms, gloo's and the
kernel's). The longer pipe stays
**emulated** everywhere: this kind of machine has no `netem`, so no delay can be put on a link; the latency
points (1 ms and 5 ms, bandwidth 100 GB/s) run on one machine with the emulator's holds, the link's time a
step being the holds on the busiest rank. **Without a cluster** the bandwidth points are emulated too
(latency 10 µs). The point with no link is one machine's run in both sweeps.

*Predict first:* which strategy will the thin pipe hurt, which the long one? Data parallelism all-reduces 4Ψ
bytes of gradients in a few collectives per step; pipeline parallelism sends small activations in 2m = 16
messages a step (8 each way), most of them on the critical path. The dotted lines are the estimator's
prediction for each point (its emulated link priced at the same bandwidth and latency). Each measured point is
the fastest of a run's steps after the first: on a shared machine other work only ever adds time to a step (at
times several times a PP step), while the link's time is in every one of them.
"""),
        code("""
FOUR = {"layers": 4}
STRATEGIES = {"DP (dp=2)": dict(dp=2), "PP (pp=2, m=8)": dict(pp=2, microbatches=8)}
BANDWIDTHS = [None, 0.02, 0.005]          # GB/s; None: no link (three points each: every one is
LATENCIES = [None, 1000, 5000]            # µs   two launches, and the notebooks run in CI)
SWEEP_STEPS = 10                          # the fastest of 9: a burst of other work on the machine misses some
across = LocalCluster(name="across", nodes=2, ranks_per_node=1).up() if ON_CLUSTER else None

def sweep_point(name, kind, v):
    # the run of strategy `name` at one point, and the link's time a step (ms): a bandwidth point on the cluster's
    # shaped link (its bytes over the rate), any other on this machine (the emulator's holds on the busiest rank)
    link = None if v is None else (f"inter={v},10" if kind == "bandwidth" else f"inter=100,{v}")
    shaped = across is not None and kind == "bandwidth" and v is not None
    c = dict(model=FOUR, ranks_per_node=1, emulate_link=None if shaped else link, **STRATEGIES[name])
    key = (name, c["emulate_link"], v if shaped else None)   # the no-link run serves both sweeps
    if key not in swept:
        label = f"{name[:2]}-" + (f"tbf{v}" if shaped else f"{c['emulate_link']}")
        if shaped:
            across.set_rate(v * 8000)   # GB/s → Mbit/s
            cfg = {k: x for k, x in c.items() if k != "model"}
            w = wire.measure_run(across, wb.RunConfig(model=FOUR, global_batch=8, seed=0, steps=SWEEP_STEPS, **cfg),
                                 out=os.path.join(OUT, label))
            swept[key] = (w.run, 1e3 * w.wire_bytes / (v * 1e9))
        else:
            r = run(label, steps=SWEEP_STEPS, **c)
            holds = r.events[r.events.cat == "emulated"].groupby("rank").seconds.sum()
            swept[key] = (r, 1e3 * holds.max() / len(r.metrics) if len(holds) else 0.0)
    return swept[key], link

sweep, swept = [], {}
for name in STRATEGIES:
    for kind, values in (("bandwidth", BANDWIDTHS), ("latency", LATENCIES)):
        for v in values:
            (r, link_ms), link = sweep_point(name, kind, v)
            cfg = wb.RunConfig(global_batch=8, model=FOUR, ranks_per_node=1, emulate_link=link, **STRATEGIES[name])
            e, rank0 = estimate(cfg, hardware=with_emulated_links(hw, cfg)), r.summary["ranks"][0]
            sweep.append({"strategy": name, "kind": kind, "value": v or (100 if kind == "bandwidth" else 0),
                          "no link": v is None,
                          "link": ("tbf" if across is not None and kind == "bandwidth" else "emulated") if v else "",
                          "measured (ms)": 1e3 * r.metrics.step_time_s.iloc[1:].min(),
                          "predicted (ms)": 1e3 * e.step_time_s,
                          "link a step (ms)": link_ms,
                          # a mean over the measured steps, where "measured (ms)" is the fastest step
                          "compute a step, rank 0 (ms)": 1e3 * rank0["compute_s"] / len(rank0["measured_steps"]),
                          "compute, estimated (ms)": 1e3 * e.step_terms["compute"]})
if across is not None:
    across.down()
sweep = pd.DataFrame(sweep)
sweep["error"] = (sweep["predicted (ms)"] - sweep["measured (ms)"]) / sweep["measured (ms)"]
sweep.round(3)
"""),
        code("""
# Each miss past 25 %, split: the no-link step (compute, this machine's) and what the link added, measured against
# the estimate's, beside the link's own time a step (the shaper's bytes over the rate; emulated, the holds rank 0's
# trace recorded — an asynchronous all-reduce records only what is left of its hold when its wait() comes)
for _, row in sweep[sweep.error.abs() > 0.25].iterrows():
    base = sweep[(sweep.strategy == row.strategy) & (sweep.kind == row.kind) & sweep["no link"]].iloc[0]
    added = row["measured (ms)"] - base["measured (ms)"]
    est_added = row["predicted (ms)"] - base["predicted (ms)"]
    hold = row["link a step (ms)"]
    compute_part, link_part = base["predicted (ms)"] - base["measured (ms)"], est_added - added
    if abs(compute_part) > abs(link_part):
        why = (f"the no-link step, {base['measured (ms)']:.1f} ms measured against {base['predicted (ms)']:.1f} "
               f"estimated (the fastest step; rank 0's compute averaged {base['compute a step, rank 0 (ms)']:.1f} ms "
               f"a step over all of them), where "
               f"the calibration (another run, timed once) gives {base['compute, estimated (ms)']:.1f} ms of compute "
               "and the rest of its step as per-step overhead")
    elif added < 0:
        why = (f"the step shrank by {-added:.1f} ms against the no-link run: not the link (its time a step is "
               f"{hold:.1f} ms) but the difference of two runs on shared cores (the estimate adds {est_added:.1f} ms)")
    elif abs(added - hold) <= max(1.0, 0.25 * hold):
        why = (f"the link's time lands on the step whole (added {added:.1f} ms, the link {hold:.1f}); the estimate "
               + (f"adds {est_added:.1f} ms, more than the link's own time: it prices more bytes than the run sent"
                  if est_added > hold else f"adds {est_added:.1f} ms, overlapping the rest with compute"))
    elif added < hold:
        why = (f"the step grew by {added:.1f} ms of the link's {hold:.1f} ms: the rest overlapped compute, and in the "
               f"estimate more of it does (it adds {est_added:.1f} ms)")
    else:
        why = (f"the step grew by {added:.1f} ms against the link's {hold:.1f} ms: the rest is not the link's but the "
               f"difference of two runs on shared cores (the estimate adds {est_added:.1f} ms)")
    point = f"{row.kind} {row.value:g}" + (f" ({row.link})" if row.link else ", no link")
    print(f"{row.strategy}, {point}: {row.error:+.0%} — compute {compute_part:+.1f} ms, link {link_part:+.1f} ms: "
          f"{why}")
"""),
        code("""
fig = make_subplots(rows=1, cols=2, subplot_titles=("thinner pipe: bandwidth (GB/s, log)", "longer pipe: latency (µs)"))
colors = {"DP (dp=2)": "#4C78A8", "PP (pp=2, m=8)": "#F58518"}
for col, kind in ((1, "bandwidth"), (2, "latency")):
    for name, color in colors.items():
        d = sweep[(sweep.strategy == name) & (sweep.kind == kind)].sort_values("value")
        fig.add_trace(go.Scatter(x=d.value, y=d["measured (ms)"], name=f"{name} measured", mode="lines+markers",
                                 line={"color": color}, showlegend=col == 1), row=1, col=col)
        fig.add_trace(go.Scatter(x=d.value, y=d["predicted (ms)"], name=f"{name} predicted", mode="lines",
                                 line={"color": color, "dash": "dot"}, showlegend=col == 1), row=1, col=col)
fig.update_xaxes(type="log", row=1, col=1)
fig.update_yaxes(title_text="step time (ms)")
link = ("the link (bandwidth: tbf on a local cluster; latency: emulated)" if ON_CLUSTER
        else "the emulated link (a teaching device)")
fig.update_layout(title=f"step time against {link}: DP follows bandwidth, PP latency", height=420)
fig.show()
"""),
        md("""
Read the PP line in the bandwidth panel against its link column: a pipeline's transfers are a few kilobytes
of activations, and even at 5 MB/s each takes a fraction of a millisecond, a few milliseconds a step in all
(on the cluster tbf's token bucket, 32 KiB, lets short bursts through at the machine's speed, so small
transfers may wait less still). Whatever the line rises beyond that is not the link's: the two stages wait on
each other's transfers, and a PP step on two shared cores moves by milliseconds from run to run. DP's line,
by contrast, follows its link column.
"""),
        code("""
def added(name, kind):
    d = sweep[(sweep.strategy == name) & (sweep.kind == kind)].set_index("value")["measured (ms)"]
    return d.iloc[-1] - d.iloc[0] if kind == "latency" else d.loc[min(d.index)] - d.loc[max(d.index)]

DP, PP = STRATEGIES
# the rule of thumb, measured (make test checks it here; tests/test_emulated_network.py in make test-all). The
# estimate puts each ratio near 4–5; the bound is 1.5, since a step on two shared cores moves by ±10 ms
costs = {f"{name[:2]}_{kind}_ms": added(name, kind) for name in STRATEGIES for kind in ("bandwidth", "latency")}
SWEEP = dict(regime="dp 2 or pp 2 on 2 cores as 2 " + ("cluster nodes (tbf bandwidth, emulated latency)" if ON_CLUSTER
                                                         else "emulated machines") + ", 4 layers",
             timing="fastest steps of runs on shared cores (an emulated link's holds are its formula)")
viz.check("a thinner pipe costs DP more than PP, and more than a longer one",
          "DP_bandwidth_ms > 1.5 * PP_bandwidth_ms and DP_bandwidth_ms > DP_latency_ms",
          margin=min(viz.headroom(1.5 * added(PP, "bandwidth"), added(DP, "bandwidth")),
                     viz.headroom(added(DP, "latency"), added(DP, "bandwidth"))), **SWEEP, **costs)
viz.check("a longer pipe costs PP more than DP, and more than a thinner one",
          "PP_latency_ms > 1.5 * DP_latency_ms and PP_latency_ms > PP_bandwidth_ms",
          margin=min(viz.headroom(1.5 * added(DP, "latency"), added(PP, "latency")),
                     viz.headroom(added(PP, "bandwidth"), added(PP, "latency"))), **SWEEP, **costs)
pd.DataFrame({kind: {name: f"{added(name, kind):+.1f} ms" for name in STRATEGIES} for kind in ("bandwidth", "latency")})
"""),
        md("""
Cutting the bandwidth costs DP far more than PP: its gradient all-reduce carries the whole model's
bytes. Raising the latency costs PP more than DP: each of its 16 messages a step pays it, most on the
critical path, while DP pays it in a handful of collectives. (The bandwidth is a real link's on a cluster,
tbf-shaped; the latency is the emulator's everywhere.)

What this means for placing a large job on machines of 8 GPUs (notebooks 05 and 07): **tensor
parallelism goes inside a machine**, on NVLink — its all-reduces are in every layer's forward and
backward, blocking, and move activations each time. **Pipeline and data parallelism cross the slower
links between machines**: a pipeline's messages are small (one micro-batch's activations at a stage
boundary), and data parallelism's large all-reduce happens once per step and hides under backward in
buckets (notebook 01), made cheaper still by the hierarchical all-reduce above or by compression.
Megatron-LM's default order puts tp innermost and pp outermost; the GPT-3 layout of notebook 05 (tp 8
inside each machine, pp and dp across) is that rule. The sweep says which of the two across-machine
strategies suffers from which property of the link: DP from a thin one, PP from a long one.

On a local cluster the rule itself has been measured (benchmarks/cluster_wire.py; docs/formulas.md, "On a
real wire"): dp 2 × tp 2 on two nodes of two ranks, `small` with 2 layers and a batch of 32 sequences, with
each tp pair across the link (`node_placement="round-robin"`) instead of inside a node, put 2.8× the bytes
on the wire a step (22.0 against 7.9 MB) and took 1.9× as long a step at 200 Mbit/s; at 1 Gbit/s, where two
shared cores' loopback is not much faster than the wire, 1.1× — and with 16 sequences a batch there, tp across
was the faster: the rule needs the link inside a node to be the faster by far, as NVLink is beside InfiniBand.
"""),
    ],
    "09_communication.ipynb",
)
