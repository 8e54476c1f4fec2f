"""Regenerates notebooks/10_long_sequences.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 10 · Long sequences: context parallelism (ring attention)

Data, tensor and pipeline parallelism split the batch, the layers' matrices and the layers. None of them
splits the **sequence**: every rank still holds activations for all s tokens of its samples, and
attention's cost grows with s². Context parallelism (the fourth axis of the Ultra-Scale Playbook,
torchtitan and Megatron-LM) gives each of cp ranks s/cp tokens of every sample. Everything per-token
(embeddings, layer norms, MLPs, the head, the loss) just runs on fewer tokens; attention needs every key,
so the keys and values travel round a **ring** (Liu et al. 2023, "Ring Attention"):

- at step i a rank computes its queries against the K/V block it holds while the block travels on to the
  next rank and the next block arrives (`batch_isend_irecv`, overlapped with the compute);
- the partial results are merged by their log-sum-exp (online softmax): exact, not an approximation;
- backward runs a second ring that carries dK/dV home;
- gradients of the (replicated) parameters are reduced over dp × cp, as torch and Megatron do.

Under the causal mask a contiguous split is unfair: the last rank's queries see every key, the first
rank's only its own. The **head-tail** split (Megatron's and torch's zig-zag) cuts the sequence into 2·cp
chunks and gives rank r chunks r and 2cp − 1 − r, so every rank gets the same work.
"""),
        code("""
import os
import pandas as pd
import plotly.graph_objects as go
import workbench as wb
from workbench import viz
from workbench.config.grid import RankGrid
from workbench.predict import formulas
from workbench.predict.estimator import RunLayout, estimate, A100_80GB

OUT = os.path.join("..", "traces", "nb10")
STEPS = 4

def run(name, **config):
    config = {"model": "tiny", "global_batch": 16, "seed": 0, "steps": STEPS, **config}
    return wb.launch(wb.RunConfig(**config), out=os.path.join(OUT, name), force=True)

viz.rank_layout(RankGrid(dp=2, cp=2, tp=2)).show()
viz.layout_table(RankGrid(dp=2, cp=2, tp=2))
"""),
        md("""
In the rank layout cp sits between tp and dp (tp fastest, then cp: its ring passes K/V in every layer, the
next-fastest links). The table's last column is the group the gradients are reduced over.

## The same model as one process

Three runs of the `tiny` model (sequence 16): one process; cp = 2 with head-tail and the ring; cp = 2 with
the contiguous split and the **all-gather** rotation (torch's other design: every rank's K/V in one
collective — more memory, one latency instead of cp − 1). Each must train the same model, step by step.
(cp = 4, and cp beside dp, tp, pp and ZeRO, are held to one process by tests/test_context_parallel_engine.py.)
"""),
        code("""
runs = {"1 process": run("one", dp=1),
        "cp 2, head-tail, ring": run("cp2", cp=2),
        "cp 2, contiguous, all-gather": run("cp2-none-allgather", cp=2, cp_balance="none", cp_rotate="allgather")}
same = viz.compare_losses(runs, baseline="1 process")
viz.check("every cp run trains the same model as one process (within 1e-5 × loss)",
          "difference <= 1e-5 * loss", difference=same.max_abs_diff, loss=same.final_loss)
same
"""),
        md("""
## The ring, replayed

Each ring step is a traced span (`cp_ring`, on the `ring` lane) with the layer, the step, whose K/V block
the rank computed on and the bytes it passed on. The chart lays the causal score matrix out in chunks
(queries down, keys across; above the diagonal everything is masked) and colours each block by the rank
that computes it, with the ring step at which its keys arrive there: step 1 is the rank's own K/V.

*Predict first:* with cp = 2 and head-tail (4 chunks), how many blocks of the triangle does each rank compute?
"""),
        code("""
viz.ring_replay(runs["cp 2, head-tail, ring"]).show()
viz.ring_replay(runs["cp 2, contiguous, all-gather"], height=300).show()
"""),
        md("""
Head-tail: every rank has an early chunk (few keys to see) and a late one (many), so each colour covers
the same area: 5 of the 10 blocks each (2 of them half-masked diagonals); at cp = 4, 9 of 36. Contiguous:
rank 0 owns one half-masked block, rank 1 the rest of the triangle.

## Each rank's share of the work, recorded

Each rank counts the unmasked query-key pairs it computed, per layer, into its trace. Beside it the
formula (`formulas.unmasked_pairs_per_rank`): with a contiguous split rank r's queries see r + ½ of the
cp blocks, so the last rank does (2cp − 1) times the first's work. With a kernel whose time follows the
unmasked work (flash attention's causal mode) a step waits for that rank: a contiguous cp = 2 would be only
1/0.74 = 1.36 times faster than one rank at attention, not 2. (This ring is eager: it computes whole
blocks, masked scores included, skipping only blocks masked whole — so here the slowest rank computes s²/2
scores with either split; the balance matters the moment the block kernel skips what is masked.)
"""),
        code("""
work = viz.attention_work({k: v for k, v in runs.items() if k != "1 process"})
viz.check("the recorded pairs equal the formula on every rank",
          "recorded == formula", recorded=work["pairs per layer (recorded)"], formula=work["pairs per layer (formula)"])
ht = work[work.balance == "head-tail"]
viz.check("head-tail gives every rank of a run the same work",
          "distinct_work_per_run == 1", distinct_work_per_run=ht.groupby("run")["pairs per layer (recorded)"].nunique())
none = work[work.balance == "none"]["pairs per layer (recorded)"].tolist()
viz.check("the contiguous split leaves the last rank with most of the work", "last_rank > 2 * first_rank",
          first_rank=none[0], last_rank=none[-1])
fig = go.Figure([go.Bar(x=[f"{r} · rank {k}" for r, k in zip(work.run, work["rank"])], y=work["share of the work"],
                        marker_color=["#4C78A8" if b == "head-tail" else "#E45756" for b in work.balance])])
fig.update_layout(height=340, yaxis={"title": "share of the causal attention work", "tickformat": ".0%"},
                  title="blue: head-tail (balanced); red: contiguous (the last rank does 74 %)")
fig.show()
work
"""),
        md("""
## What travels: K/V bytes, measured against the formula

Per layer and microbatch the ring passes cp − 1 K/V blocks forward (2·b·(s/cp)·h values each) and, in
backward, cp − 1 blocks with their dK/dV beside them (in fp32) and one last dK/dV hop home: backward moves
about twice forward's bytes. The all-gather rotation gathers all cp blocks once and reduce-scatters dK/dV.
The table sets the bytes the traces counted beside `formulas.cp_comm_bytes_per_step`.
"""),
        code("""
rows = []
for name, r in runs.items():
    if r.config["cp"] == 1:
        continue
    rank0 = r.summary["ranks"][0]
    for op, by_group in rank0["comm_bytes_per_step"].items():
        if "cp" in by_group:
            rows.append({"run": name, "op": op, "measured bytes per step": by_group["cp"],
                         "formula": rank0["predicted_comm_bytes_per_step"][op]["cp"]})
bytes_table = pd.DataFrame(rows)
viz.check("every byte on the cp group is the formula's", "measured == formula",
          measured=bytes_table["measured bytes per step"], formula=bytes_table.formula)
bytes_table
"""),
        md("""
## Activations ÷ cp

Each rank keeps the activations of its s/cp tokens, and the ring's attention keeps no s × s probabilities
at all (its merged output and log-sum-exp instead): the peak activation bytes fall by a little more than
cp — and the all-gather rotation keeps every rank's K/V until backward. Measured by the rank's memory
tracker beside the formula (`formulas.predicted_bytes`), with cp = 4's formula beside them.
"""),
        code("""
acts = viz.activations_vs_cp(runs)
cp4 = wb.RunConfig(model="tiny", global_batch=16, cp=4).to_dict()
cp4["model"] = {**wb.RunConfig().model_config.__dict__}
print(f"cp = 4, head-tail, ring (formula): {formulas.predicted_bytes(cp4)['activation'] / 1e3:.3f} kB per rank")
viz.check("measured activation bytes equal the formula for every cp",
          "measured_kB == predicted_kB", measured_kB=acts["measured (kB)"],
          predicted_kB=acts["predicted (kB)"].round(3))
fig = go.Figure([go.Bar(x=acts.run, y=acts["measured (kB)"], name="measured", marker_color="#4C78A8"),
                 go.Scatter(x=acts.run, y=acts["predicted (kB)"], name="formula", mode="markers",
                            marker={"size": 14, "symbol": "diamond", "color": "black"})])
fig.update_layout(height=340, yaxis={"title": "peak activation kB per rank"}, title="activations against cp")
fig.show()
acts
"""),
        md("""
## At scale: when the sequence is long

On real hardware the reason for cp is memory. A 6.7B model's layers at 64k tokens save over a hundred
gigabytes of activations per sequence; tensor parallelism divides most of them by t but stays inside a node.
The estimator (the same formulas, A100 rates and links) for 64 GPUs, tp = 8, the same 16 sequences of 64k
per step, cp from 1 to 8 (dp = 8/cp; each rank accumulates 16/dp microbatches of one sequence):
"""),
        code("""
guess = viz.predict("A 6.7B model (hidden 4096, 32 layers) on sequences of 64k tokens, tp = 8, ZeRO-1 over dp = 8, "
                    "selective recomputation: how many GB will one A100 need at cp = 1 (it has 80)?", unit=" GB")
guess
"""),
        code("""
LONG = wb.ModelConfig(vocab_size=51200, seq_len=65536, hidden=4096, heads=32, layers=32)   # a 6.7B at 64k
rows = []
for cp in (1, 2, 4, 8):
    layout = RunLayout(model=LONG, dp=8 // cp, tp=8, pp=1, cp=cp, zero=1, precision="mixed", global_batch=16,
                       microbatches=16 // (8 // cp), recompute="selective")
    e = estimate(layout, activations="ours", hardware=A100_80GB)
    rows.append({"cp": cp, "dp": 8 // cp, "GPUs": 8 * cp * (8 // cp),
                 "activations per GPU (GB)": e.activation_bytes_per_rank / 1e9,
                 "memory per GPU (GB)": e.memory_bytes_per_rank / 1e9, "fits": e.fits,
                 "ring K/V GB per step": e.comm_bytes_per_step.get("cp", 0) / 1e9,
                 "exposed ring s": e.step_terms["cp"], "step s": e.step_time_s})
long_seq = pd.DataFrame(rows)
viz.check("at 64k tokens cp = 1 does not fit an 80 GB GPU (85 % of it usable), and cp = 2 does",
          "not cp1_fits and cp2_fits", cp1_fits=long_seq.fits[0], cp2_fits=long_seq.fits[1],
          cp1_GB=long_seq["memory per GPU (GB)"][0], cp2_GB=long_seq["memory per GPU (GB)"][1],
          regime="the estimator, A100-80GB, 6.7B at 64k, tp 8")
long_seq
"""),
        code("""
guess.reveal(long_seq["memory per GPU (GB)"][0],
             f"Activations: {long_seq['activations per GPU (GB)'][0]:.0f} GB of it at cp = 1, falling at least ÷ cp.")
"""),
        md("""
The same tokens per GPU at every cp, so the compute hardly moves; what cp buys is memory — activations fall
at least ÷ cp (from cp 1 to 2 by more: with cp = 1 each of the 16/dp micro-batches a rank accumulates is a whole
sequence, and the attention's s × s part of its activations falls with the square of each rank's share),
which is what lets the sequence fit at all: at cp = 1 a GPU would need more than its 80 GB — and what it costs
is the ring: K/V bytes per step grow towards 2× the activations of attention's inputs, and the part of them a
block's attention does not hide lengthens the step as cp grows. (At 32k the same model fits without cp, and is
fastest so: cp is for the sequence that does not fit, not a speed-up.)
"""),
        md("""
Move the sequence length: the estimator's memory per GPU at each cp, against what it counts as usable of an A100's
80 GB (85 %: the allocator, workspaces and the CUDA context need the rest). Where the bars
turn red at cp = 1 is where context parallelism stops being a choice.
"""),
        code("""
import ipywidgets as widgets

SEQS = [8192, 16384, 32768, 65536, 131072]
USABLE = A100_80GB.usable_memory * A100_80GB.memory_bytes / 1e9   # the estimator's "fits": allocator headroom kept

def memory_against_cp(seq_len=65536):
    model = wb.ModelConfig(vocab_size=51200, seq_len=seq_len, hidden=4096, heads=32, layers=32)
    gb = []
    for cp in (1, 2, 4, 8):
        layout = RunLayout(model=model, dp=8 // cp, tp=8, pp=1, cp=cp, zero=1, precision="mixed",
                           global_batch=16, microbatches=16 // (8 // cp), recompute="selective")
        e = estimate(layout, activations="ours", hardware=A100_80GB)
        gb.append(e.memory_bytes_per_rank / 1e9)
    fig = go.Figure(go.Bar(x=[f"cp {cp}" for cp in (1, 2, 4, 8)], y=gb, name="memory per GPU (estimated)",
                           marker_color=["#E45756" if g > USABLE else "#4C78A8" for g in gb]))
    fig.add_hline(y=USABLE, line_dash="dot", annotation_text=f"usable: {USABLE:.0f} of an A100's 80 GB")
    fig.update_layout(height=340, yaxis_title="GB per GPU (estimated)",
                      title=f"{seq_len // 1024}k tokens: memory per GPU against cp (red: does not fit)")
    fig.show()

widgets.interact(memory_against_cp, seq_len=widgets.SelectionSlider(options=SEQS, value=65536, description="tokens"));
"""),
    ],
    "10_long_sequences.ipynb",
)
