"""Regenerates notebooks/08_fault_tolerance.ipynb (outputs stripped). Edit here, then run it."""
from notebook_cells import code, md, write

write([
md("""
# 8 · Fault tolerance: checkpoints, automatic restart, diagnosis

A job on thousands of GPUs fails every few hours: a machine dies, a link flaps, a rank hangs, a
gradient turns into NaN. What saves the run is (1) a checkpoint of everything the next step depends
on, written often enough and cheaply enough, (2) something that notices the failure and restarts from
it, and (3) a way to tell *who* failed and *where*. Everything below runs for real: checkpoints with
`torch.distributed.checkpoint` (DCP), restarts by torchrun (`--max-restarts`), detection from the
traced communication layer.
"""),
code("""
import json, os
import pandas as pd
import plotly.graph_objects as go
import ipywidgets as widgets
import workbench as wb
from workbench.predict import formulas
from workbench.doctor import diagnose
from workbench.engine.checkpoint import describe

OUT = os.path.join("..", "traces", "nb08")

def run(name, **config):
    return wb.launch(wb.RunConfig(model="tiny", global_batch=16, seed=0, **config), out=os.path.join(OUT, name),
                     force=True)  # re-running the notebook replaces its own runs
"""),
md("""
## A checkpoint: every rank writes its own shards

ZeRO-3 on two ranks, a checkpoint every 4 steps. Each rank writes its 1/N of the parameters and of Adam's
moments; what every data-parallel replica holds the same is written once, by the first replica.
The checkpoint only counts once rank 0 has written `workbench.json` and renamed the directory.
"""),
code("""
z3 = run("zero3", dp=2, zero=3, steps=8, checkpoint_every=4)
ckpt = os.path.join(z3.path, "checkpoints", "step_000008")
print(describe(ckpt)[:1500])
"""),
md("""
Checkpoint time and size beside the model states it holds (fp32 AdamW: 4 bytes of parameter + 8 of
moments per parameter = 12Ψ, split over the ranks). The files add DCP's index and a little framing per
tensor — large only for a model as small as this one.
"""),
code("""
marker = json.load(open(os.path.join(ckpt, "workbench.json")))
saves = [(t["workbench"]["rank"], e) for t in z3.traces for e in t["traceEvents"] if e.get("cat") == "checkpoint"]
psi = z3.config["params"]
pd.DataFrame([{"rank": r, "span": e["name"], "time (ms)": e["dur"] / 1e3, "bytes written": e["args"]["bytes"],
               "model states of this rank (12Ψ/N)": 12 * psi / 2} for r, e in saves])
"""),
code("""
pd.Series({"tensors in the checkpoint": marker["tensor_bytes"], "12Ψ (formula)": 12 * psi,
           "files on disk": marker["bytes"]}, name="bytes")
"""),
md("""
## The same checkpoint under another layout

The checkpoint names *pieces of the whole model's tensors* (`model/blocks.0.attn.qkv.weight|0+1536`), not
rank files, so a different layout finds its own pieces in it: here the ZeRO-3 checkpoint saved by two
ranks continues on one process, and on four ranks with tensor parallelism. The losses continue those of the
run that saved it, up to fp32 sums taken in another order.
"""),
code("""
half = os.path.join(z3.path, "checkpoints", "step_000004")
one = run("resharded-dp1", steps=8, resume=half)
tp = run("resharded-tp2", tp=2, steps=8, resume=half)
pd.DataFrame({"saved by dp2 ZeRO-3": z3.metrics.loss[4:].values, "resumed on 1 rank": one.metrics.loss.values,
              "resumed with tp=2": tp.metrics.loss.values}, index=range(4, 8)).rename_axis("step")
"""),
md("""
## How often to checkpoint: Young/Daly

Checkpointing every τ seconds costs δ/τ of the time (writing) plus τ/(2M) (the half interval redone on
average after each failure, M the job's mean time between failures). The sum is smallest at
Young's τ* = √(2δM) (Daly subtracts δ). A job of many machines has a small M: one machine's MTBF
divided by their number.
"""),
code("""
def young_daly_figure(checkpoint_s=30.0, machine_mtbf_days=365.0, machines=1000):
    mtbf = machine_mtbf_days * 86400 / machines
    best = formulas.young_daly_interval(checkpoint_s, mtbf)
    taus = [best * f for f in [0.1 * 1.2 ** i for i in range(40)]]
    fig = go.Figure(go.Scatter(x=[t / 60 for t in taus],
                               y=[100 * formulas.checkpoint_overhead(t, checkpoint_s, mtbf) for t in taus]))
    lost = formulas.checkpoint_overhead(best, checkpoint_s, mtbf)
    fig.add_vline(x=best / 60, line_dash="dash", annotation_text=f"τ* = {best / 60:.1f} min, {100 * lost:.1f} % lost")
    fig.update_layout(title=f"job MTBF {mtbf / 3600:.1f} h: time lost against the checkpoint interval",
                      xaxis_title="interval (min)", yaxis_title="time lost (%)", xaxis_type="log", height=350)
    return fig

young_daly_figure().show()
widgets.interact(lambda checkpoint_s, machine_mtbf_days, machines:
                 young_daly_figure(checkpoint_s, machine_mtbf_days, machines).show(),
                 checkpoint_s=widgets.FloatLogSlider(value=30, base=10, min=0, max=3, description="δ (s)"),
                 machine_mtbf_days=widgets.FloatSlider(value=365, min=30, max=1000, description="MTBF (d)"),
                 machines=widgets.IntSlider(value=1000, min=1, max=10000, description="machines"));
"""),
md("""
## A rank killed mid-way, restarted automatically

Rank 1 is killed with SIGKILL in step 5 (no handler runs, as when the out-of-memory killer or a lost
machine ends a process). torchrun notices, stops rank 0, and starts the group again; the new attempt
resumes from the newest checkpoint that verifies (before step 4) and finishes. fp32 on gloo is
deterministic, so the losses equal those of a run that never failed.
"""),
code("""
killed = run("killed", dp=2, steps=8, checkpoint_every=2, max_restarts=1, fault="kill", fault_rank=1, fault_step=5)
clean = run("clean", dp=2, steps=8)
table = killed.metrics[["step", "loss", "attempt"]].assign(uninterrupted=clean.metrics.loss)
assert (table.loss == table.uninterrupted).all()
table
"""),
md("""
Both attempts on one timeline (`trace_all_attempts.json`, which Perfetto opens too): attempt 0's steps,
the gap while torchrun restarts the group and the new processes load the checkpoint, attempt 1
redoing from step 4. The failed attempt's files are kept under `attempts/restart-0/`.
"""),
code("""
both = json.load(open(os.path.join(killed.path, "trace_all_attempts.json")))["traceEvents"]
restart = [e["ts"] for e in both if e["name"] == "restart 1"][0]
fig = go.Figure()
for e in both:
    if e.get("ph") == "X" and (e["name"].startswith("ProfilerStep") or e.get("cat") == "checkpoint"):
        after = e["ts"] >= restart
        color = "#FF9DA6" if e.get("cat") == "checkpoint" else "#54A24B" if after else "#4C78A8"
        fig.add_trace(go.Bar(x=[e["dur"] / 1e3], y=[f"rank {e['pid']}"], base=[e["ts"] / 1e3], orientation="h",
                             marker_color=color, hovertext=e["name"], showlegend=False))
fig.add_vline(x=restart / 1e3, line_dash="dash", annotation_text="restart 1")
fig.update_layout(barmode="overlay", title="steps (blue: attempt 0, green: attempt 1), checkpoints (pink)",
                  xaxis_title="ms since the first attempt started", height=300)
fig.show()
sorted(os.listdir(os.path.join(killed.path, "attempts", "restart-0")))
"""),
md("""
## A gradient turns into NaN

A NaN is injected into rank 1's gradients at step 3. The global gradient norm, which every rank
computes over every rank's share, is NaN everywhere, so all ranks skip that update together and the
run goes on (the metrics say `skipped`).
"""),
code("""
nan = run("nan", dp=2, steps=6, fault="nan-grad", fault_rank=1, fault_step=3)
assert list(nan.metrics.skipped) == [False, False, False, True, False, False]
nan.metrics[["step", "loss", "grad_norm", "skipped"]]
"""),
md("""
## A hang, diagnosed

Rank 1 stops answering in step 1 (it sleeps). Rank 0 waits in its first collective of that step until the
process-group timeout (5 s here), fails naming the operation, and torchrun stops rank 1. Each rank's
error file keeps its flight recorder — its last collectives, with their per-group sequence numbers —
and `workbench doctor RUN` lines them up: who was blocked where, and who never got there.
"""),
code("""
try:
    run("hang", dp=2, steps=4, fault="hang", fault_rank=1, fault_step=1, timeout_s=5)
except wb.RunFailed as e:
    report = diagnose(e.run.path)
print(report)
assert "behind: rank 1" in report
"""),
], "08_fault_tolerance.ipynb")
