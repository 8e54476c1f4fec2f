"""Regenerates notebooks/12_machine_underneath.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
        md("""
# 12 · The machine underneath

The other notebooks explain each strategy by its communication. This one explains why strategies behave
as they do, from the machine: how many FLOP/s a matmul really reaches, how many bytes a second memory
moves, where each operation of a training step sits between the two (the **roofline**), what fusing
operations and flash attention change, what 8-bit formats need, and where each strategy turns from
compute-bound to communication-bound. Everything is measured on the machine running this notebook (one
thread, as each rank runs), beside the formula; a GPU's datasheet is drawn for scale, labelled as such.
What runs only on a GPU (FP8 tensor cores, NVML's energy counter) says so here.
"""),
        code("""
import os
import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
import torch
import workbench as wb
from workbench import viz
from workbench.config import ModelConfig
from workbench.config.model_config import PRESETS
from workbench.measure import roofline
from workbench.predict.formulas import crossover

torch.manual_seed(0)
torch.set_num_threads(1)  # one thread, as each rank runs here
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GPT2 = ModelConfig(vocab_size=50257, seq_len=1024, hidden=768, heads=12, layers=12)  # GPT-2 small's shape
DATASHEET = {"name": "datasheet: H100 SXM, bf16", "flops": 989e12, "bandwidth": 3.35e12}
"""),
        md("""
## 1 · A roofline, measured here

**Achievable FLOP/s.** A datasheet's peak is never reached: how close a matmul gets depends on its shape
(how its tiles fill the hardware). ml-engineering's MAMF finder scans shapes and keeps the best — on an
H100 SXM 792 of the datasheet's 989 TFLOP/s. Here the same scan, on this machine's core. **Memory
bandwidth**: STREAM's copy (read a, write b) and triad (a = b + s·c).
"""),
        code("""
sizes = (32, 64, 256, 512, 1024) if DEVICE == "cpu" else (1024, 2048, 4096, 8192)
shapes = sorted({(s, s, s) for s in sizes} | {(sizes[-1], n, k) for n in sizes[2:] for k in sizes[2:]})
shapes += [(1024, 3 * 768, 768), (1024, 3072, 768), (1024, 768, 3072)]  # GPT-2's qkv, MLP up and down
sweep = pd.DataFrame(roofline.matmul_sweep(shapes, device=DEVICE)).sort_values("flops_per_s", ascending=False)
bandwidth = roofline.stream(device=DEVICE)
PEAK, BW = sweep.flops_per_s.max(), max(bandwidth.values())
best = sweep.iloc[0]
print(f"best matmul: {best.flops_per_s / 1e9:.1f} GFLOP/s at {int(best.m)} × {int(best.n)} × {int(best.k)}; "
      f"the smallest, {int(sweep.m.min())}³: {sweep[sweep.m == sweep.m.min()].flops_per_s.max() / 1e9:.1f} GFLOP/s")
print(f"memory: copy {bandwidth['copy'] / 1e9:.1f} GB/s, triad {bandwidth['triad'] / 1e9:.1f} GB/s; "
      f"ridge at {crossover.ridge(PEAK, BW):.1f} FLOPs a byte")
smallest = sweep[sweep.m == sweep.m.min()].flops_per_s.max()
viz.check("a matmul's shape matters: the best shape reaches at least twice the FLOP/s of the smallest cube",
          "best_GFLOPs >= 2 * smallest_GFLOPs", best_GFLOPs=PEAK / 1e9, smallest_GFLOPs=smallest / 1e9,
          margin=viz.headroom(PEAK / smallest, 2, below=False), regime=f"one thread, {DEVICE}",
          timing="two timed matmuls on a core other processes may share")
sweep.assign(GFLOPs=sweep.flops_per_s / 1e9).head(5)[["m", "n", "k", "GFLOPs"]]
"""),
        md("""
**Where the model sits.** Each forward operation of one training step — of `small` (8 × 64 tokens) and of
GPT-2's shape (1 × 1024 tokens) — at its **arithmetic intensity** (FLOPs over the bytes it reads and writes,
both counted from its shapes: `measure/roofline.py` lists the counts) and the FLOP/s its **measured** time
gives. Left of the ridge an operation waits on memory whatever the core could do: LayerNorm, GELU, softmax,
the loss and AdamW do a few FLOPs a value. The matmuls do 2·k FLOPs for every value they read.
"""),
        code("""
ops = pd.concat([pd.DataFrame(roofline.step_ops(PRESETS["small"], micro=8, device=DEVICE)).assign(model="small"),
                 pd.DataFrame(roofline.step_ops(GPT2, micro=1, device=DEVICE)).assign(model="GPT-2 shape")])
ridge = crossover.ridge(PEAK, BW)
ops["memory-bound"] = ops.intensity < ridge
ops["share of forward"] = ops.seconds * ops["count"] / ops.assign(t=ops.seconds * ops["count"]).groupby(
    "model").t.transform("sum")
x = np.logspace(-2, 4, 200)
fig = go.Figure()
fig.add_trace(go.Scatter(x=x, y=[crossover.attainable(i, PEAK, BW) / 1e9 for i in x], name="measured roofline",
                         line={"color": "black"}))
fig.add_trace(go.Scatter(x=x, y=[crossover.attainable(i, DATASHEET["flops"], DATASHEET["bandwidth"]) / 1e9
                                 for i in x], name=DATASHEET["name"], line={"color": "#BAB0AC", "dash": "dash"}))
KINDS = {"matmul": "#4C78A8", "attention": "#72B7B2", "element-wise": "#E45756", "optimizer": "#F58518"}
SYMBOLS = {"small": "circle", "GPT-2 shape": "diamond"}
for (kind, model), g in ops.groupby(["kind", "model"]):
    fig.add_trace(go.Scatter(x=g.intensity, y=g.flops_per_s / 1e9, mode="markers", name=f"{kind}, {model}",
                             marker={"color": KINDS[kind], "symbol": SYMBOLS[model], "size": 10},
                             text=g.op, hovertemplate="%{text}: %{x:.2f} FLOP/B, %{y:.2f} GFLOP/s"))
fig.update_layout(xaxis={"type": "log", "title": "arithmetic intensity (FLOPs a byte)"},
                  yaxis={"type": "log", "title": "GFLOP/s"}, height=480,
                  title=f"roofline of this machine ({DEVICE}, one thread), each op at its measured FLOP/s")
fig.show()
gpt2 = ops[ops.model == "GPT-2 shape"]
fastest_elementwise = gpt2[gpt2.kind == "element-wise"].flops_per_s.max()
slowest_matmul = gpt2[gpt2.kind == "matmul"].flops_per_s.min()
viz.check("memory-bound ops reach fewer FLOP/s than every matmul (GPT-2 shape)",
          "fastest_elementwise_GFLOPs < slowest_matmul_GFLOPs", fastest_elementwise_GFLOPs=fastest_elementwise / 1e9,
          slowest_matmul_GFLOPs=slowest_matmul / 1e9, margin=viz.headroom(fastest_elementwise, slowest_matmul),
          regime=f"one thread, {DEVICE}, GPT-2's shape", timing="each op timed alone on a shared core")
shares = ops[ops["memory-bound"]].groupby("model")["share of forward"].sum()
print("memory-bound ops' share of the forward time: " + ", ".join(f"{m} {v:.0%}" for m, v in shares.items()))
ops.assign(GFLOPs=ops.flops_per_s / 1e9)[["model", "op", "intensity", "GFLOPs", "memory-bound",
                                          "share of forward"]].round(3)
"""),
        md("""
## 2 · Fusion, and flash attention

An element-wise chain run eagerly reads and writes its whole tensor at every operation; fused into one
kernel (`torch.compile`), it reads its input once and writes its output once. The chain below is four cheap
operations (multiply, add, multiply by the input, add) on a 64 MB tensor, far larger than the caches, so every
pass goes to memory: eager makes nine passes over the tensor (each op reads its inputs and writes its output),
fused two. The bytes are **counted** from those passes, not measured (a CPU here shows no byte counter; on a
GPU Nsight Compute's `dram__bytes` measures them); the times are **measured**, beside the time the counted bytes
take at STREAM's triad bandwidth, measured again at this tensor's size. A third row writes eager's outputs into
buffers kept from call to call, which separates the passes from the cost of fresh memory.

(An earlier version of this chain had a GELU in it, and fusing it changed nothing: the `erf` inside GELU costs
one core more than the memory traffic around it, so that chain was compute-bound, and fusion saves only
traffic.)
"""),
        code("""
guess = viz.predict('Eager, the chain makes nine passes over its 64 MB tensor; fused into one kernel, two. How many '
                    'times faster will the fused chain run?', unit='×')
guess
"""),
        code("""
from torch._inductor import metrics

def chain(x):
    return (x * 1.702 + 0.5) * x + 1.0     # mul, add, mul (two inputs), add

x = torch.randn(2 ** 24, device=DEVICE)    # 64 MB of fp32
n, w = x.numel(), x.element_size()
triad = roofline.stream(values=n, device=DEVICE)["triad"]  # STREAM at this size (section 1's arrays: 16 MB)
eager_bytes = (2 + 2 + 3 + 2) * n * w      # each op reads its inputs and writes its output
eager_s = roofline.timed(lambda: chain(x), repeats=5, warmup=1)
kept = [torch.empty_like(x) for _ in range(4)]

def chain_into_kept(x):  # the same four ops, each writing into a buffer kept from one call to the next
    torch.mul(x, 1.702, out=kept[0])
    torch.add(kept[0], 0.5, out=kept[1])
    torch.mul(kept[1], x, out=kept[2])
    return torch.add(kept[2], 1.0, out=kept[3])

kept_s = roofline.timed(lambda: chain_into_kept(x), repeats=5, warmup=1)
metrics.reset()
compiled = torch.compile(chain)
compiled(x)
kernels = metrics.generated_kernel_count   # what Inductor generated for the chain
compiled_bytes = kernels * 2 * n * w        # a fused kernel reads x once and writes its output once
compiled_s = roofline.timed(lambda: compiled(x), repeats=5, warmup=1)
fusion = pd.DataFrame({"kernels": [4, 4, kernels],
                       "bytes counted (MB)": [eager_bytes / 1e6, eager_bytes / 1e6, compiled_bytes / 1e6],
                       "measured ms": [eager_s * 1e3, kept_s * 1e3, compiled_s * 1e3]},
                      index=["eager", "eager, outputs into kept buffers", "compiled (fused)"])
fusion["predicted ms (bytes / triad)"] = fusion["bytes counted (MB)"] * 1e6 / triad * 1e3
fusion["error %"] = 100 * (fusion["predicted ms (bytes / triad)"] / fusion["measured ms"] - 1)
print(f"triad at 64 MB: {triad / 1e9:.1f} GB/s. Eager with fresh outputs takes {eager_s / kept_s:.1f}× eager into "
      f"kept buffers, the same passes: new memory is mapped and zeroed by the operating system page by page when "
      f"first written (eager's temporaries and the compiled output are new each call; STREAM writes into kept arrays)")
viz.check("fused, the chain runs faster than eager even with eager's outputs in kept buffers: fewer passes",
          "compiled_ms < eager_kept_ms", eager_kept_ms=kept_s * 1e3, compiled_ms=compiled_s * 1e3,
          margin=viz.headroom(compiled_s, kept_s), regime=f"one thread, {DEVICE}, 64 MB tensor",
          timing="two timings on a core other processes may share")
fusion.round(2)
"""),
        code("""
guess.reveal(eager_s / compiled_s,
             f"Of plain eager's time, {1 - kept_s / eager_s:.0%} is its fresh outputs' page faults; against eager "
             f"into kept buffers the fused chain is {kept_s / compiled_s:.1f}× faster: that part is the passes.")
"""),
        md("""
Fusion cuts the time about as much as the passes it removes. The bytes-over-bandwidth prediction sits beside
each time with its error: where the outputs go into kept buffers, it is close; where each op writes a fresh
64 MB output, the measured time is well above it, and the line above the table measures why — new memory
costs the operating system's page faults on first write, which no bandwidth figure includes. A framework
that keeps its allocations (PyTorch's CUDA caching allocator does, on a GPU) pays that once.
"""),
        md("""
**Attention written out against a fused kernel.** Written out, attention materialises the s × s scores and
probabilities (and keeps the probabilities for backward); a flash kernel (`scaled_dot_product_attention`)
computes the same product block by block and keeps only its output and one log-sum-exp a row. The FLOPs are
the same, 4·b·s²·h either way: flash attention saves **memory traffic**, not arithmetic. Below, the bytes
each keeps for backward (measured by autograd's saved-tensor hooks), beside the formula, and the time of
forward and backward, at growing sequence length.
"""),
        code("""
def attention_written_out(q, k, v):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

def saved_bytes(fn, *inputs):
    seen = {}
    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    inputs_storage = {t.untyped_storage().data_ptr() for t in inputs}
    return out, sum(b for p, b in seen.items() if p not in inputs_storage)

rows = []
for s in (128, 256, 512, 1024):
    b, a, d = 1, 8, 64
    q, k, v = (torch.randn(b, a, s, d, device=DEVICE, requires_grad=True) for _ in range(3))
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for name, fn in (("written out", attention_written_out), ("sdpa (fused)", sdpa)):
        out, kept = saved_bytes(fn, q, k, v)
        seconds = roofline.timed(lambda fn=fn: fn(q, k, v).sum().backward(), repeats=3, warmup=1)
        rows.append({"s": s, "attention": name, "kept for backward MB": kept / 1e6, "fwd+bwd ms": seconds * 1e3,
                     "FLOPs (4·b·s²·h)": 4 * b * s * s * a * d})
att = pd.DataFrame(rows)
att["formula: s×s probabilities MB"] = np.where(att.attention == "written out", b * a * att.s ** 2 * 4 / 1e6, 0.0)
# the s×s traffic of the forward: written out, the scores written and read by softmax, the probabilities written
# and read by p·v (4 passes of b·a·s² values); fused, the blocks stay in cache and none reaches memory
att["formula: s×s traffic MB"] = np.where(att.attention == "written out", 4 * b * a * att.s ** 2 * 4 / 1e6, 0.0)
fig = make_subplots(rows=1, cols=2, subplot_titles=["kept for backward (MB)", "forward + backward (ms)"])
for name, color in (("written out", "#E45756"), ("sdpa (fused)", "#4C78A8")):
    g = att[att.attention == name]
    fig.add_trace(go.Scatter(x=g.s, y=g["kept for backward MB"], name=name, legendgroup=name,
                             line={"color": color}), row=1, col=1)
    fig.add_trace(go.Scatter(x=g.s, y=g["fwd+bwd ms"], name=name, legendgroup=name, showlegend=False,
                             line={"color": color}), row=1, col=2)
fig.update_xaxes(title="sequence length s", type="log")
fig.update_layout(height=360, title="attention: what it keeps and what it costs, measured").show()
wide = att.pivot(index="s", columns="attention", values="kept for backward MB")
viz.check("sdpa keeps less for backward than written-out attention at every length",
          "sdpa_MB < written_out_MB", sdpa_MB=wide["sdpa (fused)"], written_out_MB=wide["written out"])
viz.check("the written-out attention keeps at least its s×s probabilities (the formula)",
          "kept_MB >= 0.999 * probabilities_MB", kept_MB=att[att.attention == "written out"]["kept for backward MB"],
          probabilities_MB=att[att.attention == "written out"]["formula: s×s probabilities MB"])
att.round(3)
"""),
        md("""
## 3 · Formats: bf16, fp16 and FP8

Eight bits hold little: E4M3 (4 exponent bits, 3 mantissa) spans 2⁻⁶ to 448 with about one significant
digit, E5M2 trades a mantissa bit for range (to 57,344). Training in FP8 keeps weights and optimizer in
higher precision and **scales** each tensor into the format's range before the cast (model/fp8_emulated.py
says how: per tensor, delayed from a history of maxima, or per block of 32 values as the MX formats do).
"""),
        code("""
from workbench.model.fp8_emulated import E4M3, E5M2, AmaxHistory, emulate_fp8, formats, quantize
from workbench.model.gpt import GPT
from workbench.data.synthetic import global_batch

SMALL = PRESETS["small"]
model = GPT(SMALL, seed=0)
captured = {}

def keep(module, inputs, output):  # a forward hook that returns nothing leaves the output as it is
    captured["activation"] = output.detach()

model.blocks["0"].mlp.fc.register_forward_hook(keep)
inputs, targets = global_batch(0, 0, 8, SMALL.seq_len, SMALL.vocab_size)
model(inputs, targets).backward()
tensors = {"activation (block 0's MLP up)": captured["activation"],
           "gradient (block 0's MLP up weight)": model.blocks["0"].mlp.fc.weight.grad}
log2 = {name: torch.log2(t.abs().flatten() + 1e-30).clamp(min=-40).numpy() for name, t in tensors.items()}
# counted here into 80 shared bins: the chart carries 80 bars a tensor, not every value (4 MB of them)
edges = np.linspace(min(v.min() for v in log2.values()), max(v.max() for v in log2.values()), 81)
fig = go.Figure()
for (name, values), color in zip(log2.items(), ("#4C78A8", "#F58518")):
    counts, _ = np.histogram(values, bins=edges)
    fig.add_trace(go.Bar(x=(edges[:-1] + edges[1:]) / 2, y=counts, width=np.diff(edges), name=name, opacity=0.6,
                         marker_color=color, marker_line_width=0))
# each format's normal range as a bar above the chart, its edges as lines of its colour through it (labels on
# the lines themselves piled up: fp16's and E5M2's smallest normal are both 2⁻¹⁴)
for i, (f, color) in enumerate(zip(formats(), ("#54A24B", "#B279A2", "#E45756", "#72B7B2"))):
    lo, hi, y = float(np.log2(f["smallest normal"])), float(np.log2(f["max"])), 1.05 + 0.1 * i
    fig.add_shape(type="line", x0=lo, x1=hi, y0=y, y1=y, yref="paper", line={"color": color, "width": 5})
    fig.add_annotation(x=hi, y=y, yref="paper", text=f"{f['format']}: 2<sup>{lo:.0f}</sup> … 2<sup>{hi:.3g}</sup>",
                       xanchor="left", showarrow=False, font={"color": color})
    for edge in (lo, hi):
        fig.add_vline(x=edge, line_dash="dot", line_color=color)
fig.update_layout(barmode="overlay", xaxis_title="log₂ |value| (lines: each format's smallest normal and max)",
                  yaxis_title="values in the bin", height=480, margin={"t": 180},
                  title="a real activation and gradient against each format's normal range").show()
pd.DataFrame(formats())
"""),
        md("""
Cast without scaling, much of the gradient (values around 10⁻³) falls below E4M3's smallest normal and is
flushed to zero; scaled, nothing is lost and the error is the format's precision. Delayed scaling reuses the
largest maximum of the last steps (here of a growing tensor). One outlier sets a per-tensor scale that
pushes the small values under; per-block scaling confines it to its block of 32:
"""),
        code("""
grad = tensors["gradient (block 0's MLP up weight)"]
with_outlier = grad.clone()
with_outlier.view(-1)[0] = grad.abs().max() * 1000  # one outlier: it sets a per-tensor scale for everything
history = AmaxHistory(16)
for k in range(8):  # the same tensor over eight steps, growing: delayed scaling lags it
    history.scale_amax(grad * (0.8 + 0.05 * k))

def lost(x, q):  # the share of non-zero values the cast flushed to zero
    return float(((q == 0) & (x != 0)).sum() / (x != 0).sum())

rows = []
for fmt_name, fmt in (("E4M3", E4M3), ("E5M2", E5M2)):
    for scaling in ("none", "per-tensor", "delayed", "per-block"):
        amax = history.scale_amax(grad) if scaling == "delayed" else None
        q, q_out = quantize(grad, fmt, scaling, amax), quantize(with_outlier, fmt, scaling, amax and amax * 1000)
        rows.append({"format": fmt_name, "scaling": scaling, "values lost": lost(grad, q),
                     "relative error": float((q - grad).norm() / grad.norm()),
                     "values lost, one outlier ×1000": lost(with_outlier, q_out)})
t = pd.DataFrame(rows).set_index(["format", "scaling"])
viz.check("cast unscaled, E4M3 flushes a third or more of the gradient to zero; scaled per tensor, under 0.1 %",
          "unscaled_lost >= 1 / 3 and per_tensor_lost < 0.001", unscaled_lost=t.loc[("E4M3", "none"), "values lost"],
          per_tensor_lost=t.loc[("E4M3", "per-tensor"), "values lost"])
viz.check("beside one outlier, per-block scaling loses fewer values than per-tensor",
          "per_block_lost < per_tensor_lost",
          per_block_lost=t.loc[("E4M3", "per-block"), "values lost, one outlier ×1000"],
          per_tensor_lost=t.loc[("E4M3", "per-tensor"), "values lost, one outlier ×1000"])
t.round(4)
"""),
        md("""
**A short training run with FP8-emulated matmuls** — every Linear's input and weight quantised to E4M3 and
its output gradient to E5M2 (per-tensor scaling), around an fp32 matmul: the numerics of FP8 training, not
its speed (labelled *emulated*) — beside the same model trained in bf16 autocast, on the same batches.
"""),
        code("""
TRAIN = ModelConfig(vocab_size=256, seq_len=32, hidden=128, heads=4, layers=2)  # bf16 is slow on a CPU

def train(fp8, steps=30):
    torch.manual_seed(0)
    m = GPT(TRAIN, seed=0)
    if fp8:
        emulate_fp8(m)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        x, y = global_batch(0, step, 8, TRAIN.seq_len, TRAIN.vocab_size)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=not fp8):
            loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses

curves = pd.DataFrame({"bf16 (autocast)": train(False), "FP8 E4M3/E5M2 (emulated)": train(True)})
fig = go.Figure([go.Scatter(y=curves[c], name=c, line={"color": col})
                 for c, col in zip(curves, ("#4C78A8", "#E45756"))])
fig.update_layout(xaxis_title="step", yaxis_title="loss", height=340,
                  title="FP8-emulated matmuls beside bf16: the same batches, the same start").show()
last = curves.tail(10).mean()
gap = abs(last.iloc[1] / last.iloc[0] - 1)
viz.check("FP8-emulated training's loss stays within 5 % of bf16's over the last 10 steps", "gap < 0.05", gap=gap);
"""),
        md("""
**Bytes per parameter** under each recipe (model states only: parameters, gradients, master weights,
optimizer moments). FP8 training's saving is in compute and activations more than in states: Transformer
Engine keeps bf16 weights and fp32 masters (16 bytes, as bf16 mixed precision). The Ultra-Scale Playbook
tabulates the published recipes; ours are from the formula (`predict/formulas/memory.py`).
"""),
        code("""
from workbench.predict.formulas import model_state_bytes

ours = {"fp32 (ours)": sum(model_state_bytes(1, precision="fp32").values()),
        "bf16 mixed, bf16 gradients (ours)": sum(model_state_bytes(1, precision="mixed").values()),
        "bf16 mixed, fp32 main gradients (ours, Megatron)": sum(model_state_bytes(1, precision="mixed",
                                                                                  grad_bytes=4).values())}
published = {"Transformer Engine FP8": 16, "FP8-LM": 9, "DeepSeek-V3": 15, "Nanotron FP8": 10}
pd.DataFrame({"bytes per parameter": {**ours, **published},
              "from": {**{k: "formula" for k in ours}, **{k: "the Playbook's table" for k in published}}})
"""),
        code("""
if DEVICE == "cuda" and torch.cuda.get_device_capability() >= (8, 9):
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    one = torch.tensor(1.0, device="cuda")
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().t().to(torch.float8_e4m3fn)
    bf16 = roofline.timed(lambda: a.bfloat16() @ b.bfloat16(), repeats=10)
    fp8 = roofline.timed(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16), repeats=10)
    print(f"8192³ matmul: bf16 {2 * 8192 ** 3 / bf16 / 1e12:.0f} TFLOP/s, FP8 (torch._scaled_mm) "
          f"{2 * 8192 ** 3 / fp8 / 1e12:.0f} TFLOP/s — measured on {torch.cuda.get_device_name()}")
else:
    print("FP8 matmul speed runs only on a GPU with FP8 tensor cores (compute capability 8.9+: H100, H200, "
          "L40S, RTX 4090); this machine has none, so FP8 appears above as emulated numerics only.")
"""),
        md("""
## 4 · Where each strategy turns communication-bound

Each strategy's communication time over its compute time, as a function of the one variable that moves it
(`predict/formulas/crossover.py` derives each): data parallelism and ZeRO-3 by the **tokens a rank**
computes per step (the all-reduce of every gradient does not shrink with them), tensor parallelism by the
**hidden size** (its all-reduces grow as h, its matmuls as h²), a pipeline by the **tokens of a
micro-batch** against the latency α of each transfer. Above 1, no overlap can hide the communication.
Drawn for an A100 with InfiniBand (25 GB/s a GPU across nodes) and an H100 with NVLink (360 GB/s inside a
node), at the presets' achievable matmul rates.
"""),
        code("""
from workbench.predict.hardware import A100_80GB, H100_80GB

MACHINES = {"A100 + InfiniBand": (A100_80GB.matmul_flops, A100_80GB.inter_node_bw, A100_80GB.latency_s),
            "H100 + NVLink": (H100_80GB.matmul_flops, H100_80GB.intra_node_bw, H100_80GB.latency_s)}
tokens = np.logspace(1, 6, 120)
hidden = np.logspace(2, 5, 120)
fig = make_subplots(rows=2, cols=2, subplot_titles=["data parallel: tokens a rank", "ZeRO-3: tokens a rank",
                                                    "tensor parallel (t = 8): hidden size",
                                                    "pipeline (h = 4096, 4 layers a stage): tokens a micro-batch"])
for (name, (F, BW, alpha)), color in zip(MACHINES.items(), ("#4C78A8", "#E45756")):
    curves = [(1, 1, tokens, [crossover.dp_ratio(t, F, BW) for t in tokens]),
              (1, 2, tokens, [crossover.zero3_ratio(t, F, BW) for t in tokens]),
              (2, 1, hidden, [crossover.tp_ratio(h, 8, F, BW) for h in hidden]),
              (2, 2, tokens, [crossover.pp_ratio(t, 4096, 4, F, BW, alpha=alpha) for t in tokens])]
    for i, (row, col, xs, ys) in enumerate(curves):
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, legendgroup=name, showlegend=i == 0,
                                 line={"color": color}), row=row, col=col)
for row in (1, 2):
    for col in (1, 2):
        fig.add_hline(y=1, line_dash="dot", line_color="#888", row=row, col=col)
fig.update_xaxes(type="log")
fig.update_yaxes(type="log", title="communication / compute")
fig.update_layout(height=620, title="each strategy's communication over its compute (above 1: communication-bound)")
fig.show()
pd.DataFrame({name: {"DP: tokens a rank below which it is communication-bound": crossover.dp_crossover(F, BW),
                     "ZeRO-3: tokens a rank": crossover.zero3_crossover(F, BW),
                     "TP over 8: hidden size below which": crossover.tp_crossover(8, F, BW),
                     "PP: tokens a micro-batch below which (h 4096, 4 layers)": crossover.pp_crossover(
                         4096, 4, F, BW, alpha=alpha)} for name, (F, BW, alpha) in MACHINES.items()}).round(0)
"""),
        md("""
**Your cluster.** Move the sliders: the matmul rate a GPU reaches and the bandwidth each GPU has to the others
in its data-parallel group — the chart shows where data parallelism and ZeRO-3 turn communication-bound
(each rank's tokens per step below the crossover: the gradients' traffic outlasts the compute).
"""),
        code("""
import ipywidgets as widgets

def dp_explorer(tflops=230.0, link_GBps=25.0):
    F, BW = tflops * 1e12, link_GBps * 1e9
    fig = go.Figure()
    for name, ratio, cross, color in (("data parallel", crossover.dp_ratio, crossover.dp_crossover, "#4C78A8"),
                                      ("ZeRO-3", crossover.zero3_ratio, crossover.zero3_crossover, "#F58518")):
        fig.add_trace(go.Scatter(x=tokens, y=[ratio(t, F, BW) for t in tokens], name=name, line={"color": color}))
        fig.add_vline(x=cross(F, BW), line_color=color, line_dash="dash",
                      annotation_text=f"{name}: {cross(F, BW):,.0f} tokens a rank")
    fig.add_hline(y=1, line_dash="dot", line_color="#888")
    fig.update_layout(xaxis={"type": "log", "title": "tokens a rank per step"},
                      yaxis={"type": "log", "title": "communication / compute"}, height=380,
                      title=f"{tflops:.0f} TFLOP/s a GPU, {link_GBps:.0f} GB/s between them")
    fig.show()

widgets.interact(dp_explorer,
                 tflops=widgets.FloatLogSlider(value=230, base=10, min=1, max=3.3, description="TFLOP/s"),
                 link_GBps=widgets.FloatLogSlider(value=25, base=10, min=0, max=3, description="link GB/s"));
"""),
        md("""
**Measured here**, across a link: for each strategy, two runs of a small model, one on each side of its
predicted crossover. F, the compute rate the formula needs, is measured from the larger run itself (its model
FLOPs over its forward and backward time); the measured ratio is each run's communication time over its compute
time, from its trace (rank 0, the steps after the first).

**The link.** Where this machine lets us make network namespaces (as root: CI does), DP, ZeRO-3 and TP run on
a **cluster on this machine** (launching/local_cluster.py): two nodes, one rank each, whose links the kernel's
token-bucket filter holds to 1.6 Gbit/s (0.2 GB/s) — every byte of their collectives crosses a real (virtual)
wire, and the communication time is the clock's. A pipeline's crossover is about latency, which this machine
cannot add to a link (no `netem`), so PP's link stays **emulated** (comm/emulated_link.py holds each transfer for
20 ms on the sending side): its communication time is the emulator's formula, and its point checks the compute
half only. Where no cluster can be made, all four use the emulated link (the cell says which ran). Each point
is a timing claim: two ranks share this machine's cores, so a busy core moves the ratio; the check below shows
its margin and is not asserted.
"""),
        code("""
BW_LINK, LATENCY_S = 0.2e9, 0.02   # the emulated link: 0.2 GB/s (DP, ZeRO-3, TP); 20 ms a message (PP)
SHORT = {"base": "small", "seq_len": 32}  # small, 32 tokens a sequence
SHORT_N = wb.RunConfig(model=SHORT).model_config.param_count()
from workbench.launching import local_cluster

try:  # two nodes of one rank, their links at BW_LINK (tc tbf); removed when the kernel ends
    WIRE = local_cluster.cluster("nb12", nodes=2, ranks_per_node=1, rate_mbit=BW_LINK * 8 / 1e6)
    print(f"DP, ZeRO-3 and TP on a real wire: 2 nodes (network namespaces) joined by links of "
          f"{BW_LINK * 8 / 1e9:.1f} Gbit/s (tc tbf); PP's 20 ms latency stays emulated (no netem here)")
except wb.ConfigError as e:
    WIRE = None
    print(f"no cluster can be made on this machine ({e}): all four on the emulated link")
# the figures in the comments below were measured on the emulated link; on the tbf link the crossovers, with F
# measured, moved up (DP about 400 tokens, ZeRO-3 about 560, in one run): each far side still clears its own
PLANS = {  # strategy: (variable, low, high, settings for a value)
    # DP's far side at 1024: at 512 (1.6× its crossover of about 310) the ratio sat at 0.6–1.1 over five runs
    "DP": ("tokens a rank", 32, 1024, lambda v: dict(model=SHORT, dp=2, global_batch=2 * v // 32)),
    # ZeRO-3's far side at 2048, not 512: at 512 it sat near 1 (the crossover, with F measured, is 430–510 tokens)
    "ZeRO-3": ("tokens a rank", 32, 2048, lambda v: dict(model=SHORT, dp=2, zero=3, global_batch=2 * v // 32)),
    # TP's far side at 1024, not 512: at 512 the measured ratio sat at 1.0–1.07 (a one-layer model also all-reduces
    # around its embedding and loss, and a rank's collective absorbs its peer's lag on two shared cores)
    "TP": ("hidden size", 32, 1024, lambda v: dict(model={**SHORT, "hidden": v, "heads": 4, "layers": 1}, tp=2,
                                                   global_batch=4, lr=1e-3)),
    # PP's far side at 1024: at 512 the measured ratio sat at 0.85–0.96, 4–15 % from the turn
    "PP": ("tokens a micro-batch", 32, 1024, lambda v: dict(model=SHORT, pp=2, microbatches=2,
                                                           global_batch=2 * v // 32)),
}

from workbench.trace.spans import intersection_length, union_length  # what summary.json counts time with

def intervals(spans):  # a table's spans as (start_us, end_us)
    return list(zip(spans.start_us, spans.end_us))

def launch_point(kind, value):
    variable, low, high, settings = PLANS[kind]
    wire = WIRE if kind != "PP" else None
    link = None if wire else f"inter=100,{LATENCY_S * 1e6:.0f}" if kind == "PP" else f"inter={BW_LINK / 1e9},0"
    run = wb.launch(wb.RunConfig(steps=4, ranks_per_node=1, emulate_link=link, **settings(value)),
                    out=os.path.join("..", "traces", "nb12", f"{kind}_{value}"), force=True, progress=False,
                    cluster=wire)
    everything = run.events[run.events["rank"] == 0]
    ev = everything[everything.step >= 1]  # the steps after the first (which pays one-off costs)
    steps = ev.step.nunique()
    if kind == "PP":  # each micro-batch's send (its hold on the link: the same every step) against its forward
        holds = everything[(everything.cat == "emulated") & (everything.lane == "launch")].dur_us
        comm = holds.sum() / everything.step.nunique() * steps
        compute = ev[ev.cat == "forward"].dur_us.sum()
    else:
        group = "tp" if kind == "TP" else "dp"
        # the link's busy time: the union of the group's collectives in flight (an asynchronous one's span runs
        # from its issue, and queues behind those before it: their sum would count the queue twice)
        comm = union_length(intervals(ev[(ev.cat == "collective") & (ev.group == group)]))
        # compute: forward and backward less the time the rank stood blocked inside them (a blocking collective,
        # or a wait for one in flight: TP's all-reduces, ZeRO-3's gathers sit inside its forward and backward)
        passes = ev[ev.cat.isin(["forward", "backward"])]
        blocked = ev[(ev.cat == "wait") | ((ev.cat == "collective") & (ev.kind == "span"))]
        compute = passes.dur_us.sum() - intersection_length(intervals(passes), intervals(blocked))
    sent = run.summary["ranks"][0]["bytes_moved_per_step"]
    return {"strategy": kind, "variable": variable, "value": value, "measured ratio": comm / compute,
            "compute s a step": compute / 1e6 / steps, "comm ms a step": comm / 1e3 / steps,
            "link formula ms a step": (comm / 1e3 / steps if kind == "PP" else sent / BW_LINK * 1e3), "run": run}

def compute_rate(point):
    # FLOP/s of the run's compute, by the formulas' own count
    v, c = point["value"], point["compute s a step"]
    if point["strategy"] in ("DP", "ZeRO-3"):
        return 6 * SHORT_N * v / c
    if point["strategy"] == "TP":  # one layer: 3 × 24·T·h²/t, T = 4 × 32 tokens a step
        return 3 * 24 * 128 * v ** 2 / 2 / c
    return 24 * v * 256 ** 2 * 2 * 2 / c  # PP: two micro-batches' forward of 2 layers a stage, h 256

def crossover_at(kind, F):  # the formula's crossover for a compute rate F, on the emulated link
    return {"DP": lambda: crossover.dp_crossover(F, BW_LINK, g=4, n=2),
            "ZeRO-3": lambda: crossover.zero3_crossover(F, BW_LINK, g=4, n=2),
            "TP": lambda: crossover.tp_crossover(2, F, BW_LINK, g=4),
            "PP": lambda: crossover.pp_crossover(256, 2, F, 100e9, alpha=LATENCY_S, g=4)}[kind]()

points, predicted = [], {}
for kind, (variable, low, high, _) in PLANS.items():
    pair = [launch_point(kind, low), launch_point(kind, high)]
    if WIRE and kind == "TP":  # the last to use it
        WIRE.down()
    F = compute_rate(pair[1])
    predicted[kind] = crossover_at(kind, F)
    for p in pair:
        def ratio(rate):  # the formula's communication / compute at this point, with compute at `rate` FLOP/s
            return (crossover.pp_ratio(p["value"], 256, 2, rate, 100e9, alpha=LATENCY_S, g=4) if kind == "PP" else
                    crossover_at(kind, rate) / p["value"])
        points.append({k: v for k, v in p.items() if k != "run"}
                      | {"F GFLOP/s": F / 1e9, "predicted crossover": predicted[kind], "predicted ratio": ratio(F),
                         "this point's own GFLOP/s": compute_rate(p) / 1e9,
                         "predicted ratio, own rate": ratio(compute_rate(p))})
measured = pd.DataFrame(points)
measured["error %"] = 100 * (measured["predicted ratio"] / measured["measured ratio"] - 1)
measured["error %, own rate"] = 100 * (measured["predicted ratio, own rate"] / measured["measured ratio"] - 1)
# PP's communication is the emulator's holds, its formula: with the point's own compute rate, the formula would be
# compared with itself, so that error is not given (a dash, not a number)
own = measured["error %, own rate"].round(3).astype(object)
own[measured.strategy == "PP"] = "— (formula against itself)"
measured["error %, own rate"] = own
fig = make_subplots(rows=1, cols=4, subplot_titles=list(PLANS))
for i, (kind, g) in enumerate(measured.groupby("strategy", sort=False), start=1):
    fig.add_trace(go.Scatter(x=g.value, y=g["measured ratio"], mode="markers+lines", name="measured",
                             legendgroup="measured", showlegend=i == 1, marker={"color": "#E45756", "size": 10},
                             line={"color": "#E45756", "dash": "dot"}), row=1, col=i)
    fig.add_vline(x=predicted[kind], line_color="#4C78A8", row=1, col=i)
    fig.add_hline(y=1, line_dash="dot", line_color="#888", row=1, col=i)
fig.update_xaxes(type="log")
fig.update_yaxes(type="log")
fig.update_layout(height=330, title="measured communication / compute on either side of each predicted "
                                    "crossover (blue line: the formula's, with F measured)").show()
for kind, g in measured.groupby("strategy", sort=False):
    low, high = g.iloc[0], g.iloc[1]
    viz.check(f"{kind}: the measured ratio brackets the predicted crossover",
              "low_tokens < crossover < high_tokens and ratio_low > 1 > ratio_high", low_tokens=low.value,
              high_tokens=high.value, crossover=predicted[kind], ratio_low=low["measured ratio"],
              ratio_high=high["measured ratio"],
              margin=min(viz.headroom(low["measured ratio"], 1, below=False), viz.headroom(high["measured ratio"], 1)),
              regime=f"2 ranks on {os.cpu_count()} cores, small at 32 tokens a sequence, "
                     + ("a tbf-shaped link" if WIRE and kind != "PP" else "emulated link"),
              timing="two ranks' compute on shared cores"
                     + ("" if WIRE and kind != "PP" else "; the link's time is the emulator's formula"))
measured.round(3)
"""),
        md("""
**Errors named.** Each point's error is given twice. With F, the far point's rate: there the far point's
error says little (F came from that run; for PP the link column is the trace's own holds), and the near points
miss far more, because a step that small computes at a fraction of F (the column "this point's own GFLOP/s":
each layer's fixed cost in Python and autograd, which no FLOP count sees). With each point's own rate, the
compute half is taken out, and what error is left is communication: "link formula ms a step" is bytes / rate
for the payload bytes the trace counted (what the emulator would hold them for; on the wire, 5–7 % more go
with TCP's headers), "comm ms a step" what the trace measured — the union of the group's collectives in flight
on rank 0: the wire's time, and with it the wait for the other rank and each gloo call's own cost. Where the
second is far above the first, that is the difference: TP at hidden 32, whose messages are a few kilobytes,
is all per-call cost; ZeRO-3 and TP at hidden 1024 spend well above their bytes / rate (compare the two
columns: 1.7–4.3× over the runs we have seen, more on a busier machine), their collectives blocking inside
forward and backward, where each waits for the other rank's compute to reach it (on two shared cores, a rank's
compute is slowed by its peer's). For PP the communication is the emulator's holds, its
formula, so its error with its own rate is not given: it would compare the formula with itself.
"""),
        md("""
## 5 · Energy

NVML's energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules since the driver loaded) read
around a step gives joules per token, the figure a cluster pays for besides time.
"""),
        code("""
if DEVICE == "cuda":
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows = []
    for name, settings in (("one GPU, fp32", {}), ("one GPU, bf16 + sdpa", {"precision": "bf16", "attention": "sdpa"})):
        before = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        run = wb.launch(wb.RunConfig(model="small", steps=20, backend="nccl", **settings),
                        out=os.path.join("..", "traces", "nb12", "energy"), force=True, progress=False)
        joules = (pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) - before) / 1e3
        rows.append({"run": name, "joules": joules, "joules a token": joules / run.metrics.tokens.sum()})
    display(pd.DataFrame(rows))
else:
    print("NVML's energy counter needs an NVIDIA GPU: this machine has none, so no joules are measured here "
          "(the cell measures two runs' joules per token on a GPU machine).")
"""),
    ],
    "12_machine_underneath.ipynb",
)
