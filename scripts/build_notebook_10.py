"""Regenerates notebooks/10_long_sequences_and_experts.ipynb (outputs stripped). Edit here, then run it."""
from notebook_cells import code, md, write

write([
md("""
# 10 · Long sequences and experts: context parallelism (ring attention) and expert parallelism (all-to-all)

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
from workbench.predict.estimator import estimate, A100_80GB

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
LONG = wb.ModelConfig(vocab_size=51200, seq_len=65536, hidden=4096, heads=32, layers=32)   # a 6.7B at 64k
rows = []
for cp in (1, 2, 4, 8):
    e = estimate(model=LONG, dp=8 // cp, tp=8, pp=1, cp=cp, zero=1, precision="mixed", global_batch=16,
                 microbatches=16 // (8 // cp), recompute="selective", activations="ours", hardware=A100_80GB)
    rows.append({"cp": cp, "dp": 8 // cp, "GPUs": 8 * cp * (8 // cp),
                 "activations per GPU (GB)": e.activation_bytes_per_rank / 1e9,
                 "memory per GPU (GB)": e.memory_bytes_per_rank / 1e9, "fits": e.fits,
                 "ring K/V GB per step": e.comm_bytes_per_step.get("cp", 0) / 1e9,
                 "exposed ring s": e.step_terms["cp"], "step s": e.step_time_s})
long_seq = pd.DataFrame(rows)
viz.check("at 64k tokens cp = 1 does not fit an 80 GB GPU, and cp = 2 does",
          "not cp1_fits and cp2_fits", cp1_fits=long_seq.fits[0], cp2_fits=long_seq.fits[1],
          cp1_GB=long_seq["memory per GPU (GB)"][0], cp2_GB=long_seq["memory per GPU (GB)"][1],
          regime="the estimator, A100-80GB, 6.7B at 64k, tp 8")
long_seq
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
# Today's block: what grouped-query attention and SwiGLU change

Llama 3, Mistral and Qwen train a different block from GPT-2's (`model/llama.py`): RMSNorm, rotary
positions, **grouped-query attention** — `kv_heads` K/V heads, each shared by heads/kv_heads query heads
(Ainslie et al. 2023) — and a **SwiGLU** MLP, silu(x·W_gate) ⊙ (x·W_up) then W_down: three matrices of an
inner width f ≈ 8/3·h instead of two of 4h. `tiny-llama` has 4 query heads and 2 K/V heads (g = 16 of h = 32
values a token for K and for V) and f = 96.

Predict first, in the box below. Then: under tensor parallelism (tp = 2: one K/V head a rank), what
happens to a rank's parameters and activations?

Four runs: `tiny-llama` and its multi-head twin (`kv_heads` = heads = 4), each with cp = 2 and with tp = 2.
"""),
code("""
guess_kv = viz.predict('The ring carries K and V. With half as many K/V heads as query heads (grouped-query '
                       "attention), what percentage of the multi-head ring's bytes a step will it carry?", unit=' %')
guess_kv
"""),
code("""
MHA = {"base": "tiny-llama", "kv_heads": 4}
block = {"GQA, cp 2": run("gqa-cp2", model="tiny-llama", cp=2), "MHA, cp 2": run("mha-cp2", model=MHA, cp=2),
         "GQA, tp 2": run("gqa-tp2", model="tiny-llama", tp=2), "MHA, tp 2": run("mha-tp2", model=MHA, tp=2)}
rows = []
for name, r in block.items():
    rank0 = r.summary["ranks"][0]
    ring = sum(by.get("cp", 0) for by in rank0["comm_bytes_per_step"].values())
    ring_formula = sum(by.get("cp", 0) for by in rank0["predicted_comm_bytes_per_step"].values())
    rows.append({"run": name, "ring bytes/step (measured)": ring, "ring (formula)": ring_formula,
                 "param bytes/rank (measured)": rank0["peak_bytes"]["parameter"],
                 "param (formula)": rank0["predicted_bytes"]["parameter"],
                 "activation bytes/rank (measured)": rank0["peak_bytes"]["activation"],
                 "activation (formula)": rank0["predicted_bytes"]["activation"]})
kv = pd.DataFrame(rows).set_index("run")
for what in ("ring", "param", "activation"):
    measured = [c for c in kv.columns if c.startswith(what) and "measured" in c][0]
    formula = [c for c in kv.columns if c.startswith(what) and "formula" in c][0]
    viz.check(f"{what} bytes measured equal the formula in every run", "measured == formula", measured=kv[measured],
              formula=kv[formula].round())
ratio = kv.loc["GQA, cp 2", "ring bytes/step (measured)"] / kv.loc["MHA, cp 2", "ring bytes/step (measured)"]
viz.check("the ring carries half the K/V bytes with half the K/V heads", "abs(ratio - 0.5) < 1e-9", ratio=ratio)
kv
"""),
code("""
guess_kv.reveal(100 * ratio,
                'K and V are kv_heads·head_dim values a token each, not h: half the heads, half the bytes.')
"""),
md("""
The ring's bytes halve exactly: it carries g = kv_heads·head_dim values of K and of V a token, not h
(`formulas.cp_comm_bytes_per_step(..., kv_width)`). Under tp = 2 each rank holds one K/V head of two: its
q|k|v matrix has h/t + 2·g/t rows instead of 3·h/t, and the k and v it saves shrink the same way — the
parameter and activation bytes measured above, to the byte. (A tp of 4 would split a K/V head: `RunConfig(
model="tiny-llama", tp=4)` is refused before launch, naming the valid tp.)

## The MLP's share of the FLOPs and of the activations

Measured on one forward of each model: torch's FLOP counter (`FlopCounterMode`: each matmul's FLOPs from
the shapes it ran with; the counter runs on the meta device, so Llama 3 8B at 8,192 tokens costs no memory)
and the saved-tensor hooks (the bytes each part saves for backward), both by part
(`workbench.measure.by_module`), beside the formulas: forward FLOPs per token 2·(h·(h + 2g) + h·h) + 4·s·h
for attention (q·kᵀ and p·v over all s keys, the convention) and 2·h·f·3 for SwiGLU (2·h·f·2 for GELU); saved
values per token h + 4f for SwiGLU (input, gate|up, silu, product) and h + 2f for GELU.
"""),
code("""
import dataclasses
import torch
from workbench.config.model_config import PRESETS
from workbench.measure.by_module import flops_by_part, saved_bytes_by_part
from workbench.model.gpt import GPT
from workbench.predict.formulas import activations as act_formula

def matmul_flops(cfg):
    h, s = cfg.hidden, cfg.seq_len
    attn = 2 * h * cfg.qkv_width + 2 * h * h + 4 * s * h
    mlp = 2 * h * cfg.mlp_in_width + 2 * cfg.inner * h
    return attn, mlp

rows = []
twins = {"tiny-llama (GQA + SwiGLU)": PRESETS["tiny-llama"], "tiny (GPT-2's block)": PRESETS["tiny"],
         "llama3-8b at 8,192 tokens": PRESETS["llama3-8b"]}
for name, cfg in twins.items():
    big = cfg.hidden > 1000
    with torch.device("meta" if big else "cpu"):
        model = GPT(cfg, seed=0)
        x = torch.randint(0, cfg.vocab_size, (1, cfg.seq_len))
    flops = flops_by_part(model, x)
    tokens = cfg.seq_len
    attn_f, mlp_f = matmul_flops(cfg)
    row = {"model": name, "attention FLOPs/token (measured)": flops["attn"] / tokens, "(formula)": attn_f,
           "MLP FLOPs/token (measured)": flops["mlp"] / tokens, "(formula) ": mlp_f,
           "MLP share of the block's FLOPs": flops["mlp"] / (flops["attn"] + flops["mlp"])}
    if not big:  # activations: real tensors on the CPU
        saved = saved_bytes_by_part(model, x, torch.roll(x, -1, 1))
        mlp_bytes = (cfg.hidden + act_formula.mlp_saved_values(cfg)) * tokens * 4
        row.update({"MLP saved bytes/layer (measured)": saved["mlp"], "(formula)  ": mlp_bytes,
                    "MLP share of a layer's activations": saved["mlp"] / sum(v for k, v in saved.items()
                                                                            if k != "other")})
    rows.append(row)
share = pd.DataFrame(rows).set_index("model")
viz.check("torch's FLOP counter equals the formulas for attention and the MLP",
          "all(attention == attention_formula) and all(mlp == mlp_formula)",
          attention=share["attention FLOPs/token (measured)"], attention_formula=share["(formula)"],
          mlp=share["MLP FLOPs/token (measured)"], mlp_formula=share["(formula) "])
small = share.dropna()
viz.check("the MLP's saved bytes equal the formula (SwiGLU: h + 4f values a token)",
          "measured == formula", measured=small["MLP saved bytes/layer (measured)"], formula=small["(formula)  "])
share.astype(object).fillna("—")  # llama3-8b's activations are not measured: its FLOPs are counted on meta tensors
"""),
md("""
SwiGLU keeps the MLP's cost where GPT-2's was: three matrices of f ≈ 8/3·h multiply as much as two of 4h
(about two thirds of a block's matmul FLOPs either way), which is why Llama chose that width. What it saves
for backward grows: four tensors of width f where GELU kept two of 4h — at Llama 3 8B's f = 3.5·h, the MLP
keeps 15h values a token against GELU's 9h, the largest part of a layer's activations, and the first
thing selective recomputation or a fused SwiGLU kernel targets. Grouped-query attention, for its part, cuts
what K and V cost everywhere they appear: projections, saved tensors, and every byte the ring moves.

"""),
md("""
# Experts: a mixture of experts, and expert parallelism

A mixture-of-experts MLP (GShard, Switch, Mixtral, DeepSeek) replaces each block's MLP by E expert MLPs and a
router: each token goes to the top-k experts by the router's scores, and its output is the gate-weighted sum
of theirs. The parameters grow E-fold, the compute per token only k-fold. **Expert parallelism** shards the
experts over an `ep` group carved from dp: every rank still routes its own tokens, then an **all-to-all**
sends each token to the rank holding its expert and a second one brings the outputs back (and two more in
backward). Expert gradients are reduced over the ranks that hold the same experts, dense ones over all of dp.

`tiny-moe` is `tiny` with 4 experts, top-2. Three runs: one process; dp = ep = 2, dropless (torchtitan's and
Megatron's dispatch: the per-expert counts exchanged first, then variable splits); the same without the
Switch auxiliary loss (coefficient 0 instead of 0.01).
"""),
code("""
MOE_STEPS = 12
moe = {"One process": run("moe-one", model="tiny-moe", steps=MOE_STEPS),
       "ep 2, dropless": run("moe-ep2", model="tiny-moe", dp=2, ep=2, steps=MOE_STEPS),
       "ep 2, no aux loss": run("moe-ep2-noaux", model="tiny-moe", dp=2, ep=2, aux_loss_coef=0.0, steps=MOE_STEPS)}
same = viz.compare_losses({k: moe[k] for k in ("One process", "ep 2, dropless")}, baseline="One process")
viz.check("expert parallelism trains the same model as one process (within 1e-5 × loss)",
          "difference <= 1e-5 * loss", difference=same.max_abs_diff, loss=same.final_loss)
same
"""),
md("""
## The all-to-all, as a matrix

Each dispatch is traced with the rows it sent to and received from every rank. Rank r's row of the matrix:
the tokens it sent to each rank in the first layer's forward dispatch of one step — the diagonal stays home.
"""),
code("""
NAME = "all_to_all moe blocks.0 dispatch forward"
raw = {t["distributedInfo"]["rank"]: [e["args"]["send_splits"] for e in t["traceEvents"]
       if e.get("name") == NAME and e.get("args", {}).get("step") == MOE_STEPS - 1]
       for t in moe["ep 2, dropless"].traces}
matrix = pd.DataFrame({f"to rank {d}": [raw[r][0][d] for r in sorted(raw)] for d in range(2)},
                      index=[f"from rank {r}" for r in sorted(raw)])
viz.check("every assignment is sent somewhere: each rank sends its T·k = 8·16·2 rows", "rows_sent == 256",
          rows_sent=matrix.sum(axis=1))
fig = go.Figure(go.Heatmap(z=matrix.values, x=list(matrix.columns), y=list(matrix.index), colorscale="Blues",
                           text=matrix.values, texttemplate="%{text}"))
fig.update_layout(height=300, title="tokens from rank to rank, layer 0's dispatch (last step)")
fig.show()
matrix
"""),
md("""
## Tokens per expert, with and without the auxiliary loss

Every step's tokens per expert (the whole batch's, in `metrics.jsonl`). The Switch loss coef·E·Σ fₑ·Pₑ is
smallest when routing is uniform (where it equals coef); without it nothing pulls the router towards
balance, and with a real model a few experts tend to take most tokens. Here, in 12 steps of a tiny model,
the spread of the counts is the thing to compare — and, from the same counts, how much longer the busiest
ep rank's experts work than a balanced share (`formulas.expert_imbalance`): the step's expert compute waits
for it.
"""),
code("""
rows = []
for name in ("ep 2, dropless", "ep 2, no aux loss"):
    for r in moe[name].metrics.itertuples():
        for e, n in enumerate(r.tokens_per_expert["blocks.0"]):
            rows.append({"run": name, "step": r.step, "expert": f"expert {e}", "tokens": n})
counts = pd.DataFrame(rows)
fig = go.Figure()
for (name, expert), d in counts.groupby(["run", "expert"]):
    fig.add_trace(go.Scatter(x=d.step, y=d.tokens, mode="lines", name=f"{expert} · {name}",
                             line={"dash": "solid" if name == "ep 2, dropless" else "dot"}))
fig.update_layout(height=380, title="layer 0: tokens per expert per step (solid: aux loss 0.01; dotted: none)",
                  xaxis_title="step", yaxis_title="tokens (of 16·16·2 = 512 assignments)")
fig.show()
from workbench.predict.formulas import expert_imbalance
imbalance = pd.DataFrame({name: [expert_imbalance(s["blocks.0"], 2) for s in moe[name].metrics.tokens_per_expert]
                          for name in ("ep 2, dropless", "ep 2, no aux loss")})
dropped = moe["ep 2, dropless"].metrics.dropped_tokens
viz.check("dropless: no assignment is dropped in any step (no capacity limit)", "dropped == 0",
          dropped=dropped)
balance = pd.DataFrame({"spread of tokens per expert (std)": counts.groupby("run").tokens.std(),
                        "busiest ep rank / mean, median over steps": imbalance.median()})
aux, free = balance["busiest ep rank / mean, median over steps"]
if abs(aux - free) < 0.05:
    why = ("no difference in the busiest rank's load: in 12 steps of a tiny model on synthetic tokens the router "
           "has not learned to prefer any expert, so nothing has collapsed for the loss to undo (the per-expert "
           "spread above moves step to step in both runs). The collapse it prevents builds over thousands of steps "
           "on real data (Fedus et al. 2021, Switch Transformer).")
else:
    why = "the loss keeps the busiest rank " + ("closer to" if aux < free else "no closer to") + " the mean."
print(f"busiest ep rank over the mean: {aux:.3f} with the aux loss, {free:.3f} without — {why}")
balance
"""),
md("""
## Capacity: what a fixed budget per expert drops

DeepSpeed's dispatch gives every expert a fixed C = ⌈F·T·k/E⌉ rows from each rank, so that the all-to-all
has equal splits; what routes beyond C is dropped (the token keeps its residual only). The slider takes the
recorded counts of the dropless run (each rank's share taken as half the batch's) and counts what each
capacity factor F would drop.
"""),
code("""
import ipywidgets as widgets
import numpy as np
from workbench.predict.formulas.expert_parallel import capacity

per_rank_tokens = 16 // 2 * 16                       # T: a rank's tokens per step
def dropped_share(f):
    cap = capacity(per_rank_tokens, 2, 4, f)
    steps = moe["ep 2, dropless"].metrics.tokens_per_expert
    return float(np.mean([sum(max(0, n / 2 - cap) for n in s["blocks.0"]) / 256 for s in steps]))

FACTORS = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
def capacity_chart(factor=1.0):
    fig = go.Figure(go.Scatter(x=FACTORS, y=[dropped_share(f) for f in FACTORS], mode="lines+markers",
                               name="dropped share (from the recorded counts)"))
    fig.add_trace(go.Scatter(x=[factor], y=[dropped_share(factor)], mode="markers+text", name="chosen",
                             text=[f"{dropped_share(factor):.1%}"], textposition="top center",
                             marker={"size": 14, "symbol": "diamond", "color": "black"}))
    fig.update_layout(height=340, xaxis_title="capacity factor F", yaxis={"title": "assignments dropped",
                      "tickformat": ".0%"}, title="capacity against drops")
    fig.show()
widgets.interact(capacity_chart, factor=widgets.SelectionSlider(options=FACTORS, value=1.0, description="F"));
viz.check("a factor of 2 drops nothing here", "dropped_share == 0", dropped_share=dropped_share(2.0));
"""),
], "10_long_sequences_and_experts.ipynb")
