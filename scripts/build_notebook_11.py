"""Regenerates notebooks/11_experts_and_modern_block.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 11 · Today's block and experts: grouped-query attention, SwiGLU, and expert parallelism (all-to-all)

GPT-2's block is where the notebooks began. The models trained today change it in two places this notebook
measures: the block itself (Llama's grouped-query attention and SwiGLU MLP, and what they do to the bytes
tensor and context parallelism move and keep), and the MLP replaced by a **mixture of experts**, whose
tokens travel to their experts by an all-to-all. Context parallelism's ring is notebook 10's.
"""),
        code("""
import os
import pandas as pd
import plotly.graph_objects as go
import workbench as wb
from workbench import viz

OUT = os.path.join("..", "traces", "nb11")
STEPS = 4

def run(name, **config):
    config = {"model": "tiny", "global_batch": 16, "seed": 0, "steps": STEPS, **config}
    return wb.launch(wb.RunConfig(**config), out=os.path.join(OUT, name), force=True)
"""),
        md("""
## Today's block: what grouped-query attention and SwiGLU change

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

### The MLP's share of the FLOPs and of the activations

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
## Experts: a mixture of experts, and expert parallelism

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
### The all-to-all, as a matrix

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
### Tokens per expert, with and without the auxiliary loss

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
### Capacity: what a fixed budget per expert drops

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
    ],
    "11_experts_and_modern_block.ipynb",
)
