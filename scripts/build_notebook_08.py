"""Regenerates notebooks/08_fault_tolerance.ipynb (outputs stripped). Edit here, then run it."""

from notebook_cells import code, md, write

write(
    [
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
from workbench import viz
from workbench.predict import formulas
from workbench.analysis.doctor import diagnose
from workbench.engine.checkpoint.save_load import describe

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
guess = viz.predict("The run trains in fp32 with AdamW. How many bytes a parameter will its checkpoint's tensors "
                    'hold?', unit=' bytes')
guess
"""),
        code("""
marker = json.load(open(os.path.join(ckpt, "workbench.json")))
saves = [(t["workbench"]["rank"], e) for t in z3.traces for e in t["traceEvents"] if e.get("cat") == "checkpoint"]
psi = z3.config["params"]
pd.DataFrame([{"rank": r, "span": e["name"], "time (ms)": e["dur"] / 1e3, "bytes written": e["args"]["bytes"],
               "model states of this rank (12Ψ/N)": 12 * psi / 2} for r, e in saves])
"""),
        code("""
extra = marker["tensor_bytes"] - 12 * psi
viz.check("the checkpoint's tensors are the model states, 12Ψ, written once (beside them only Adam's step "
          "and each rank's RNG state: a few kB)", "0 < extra_bytes < 11_000", extra_bytes=extra)
written = [e["args"]["bytes"] for _, e in saves if e["name"] == "checkpoint save step 8"]
viz.check("ZeRO-3: each of the two ranks writes its own half", "min(bytes_per_rank) > 0.4 * sum(bytes_per_rank)",
          bytes_per_rank=written)
pd.Series({"tensors in the checkpoint": marker["tensor_bytes"], "12Ψ (formula)": 12 * psi,
           "files on disk": marker["bytes"]}, name="bytes")
"""),
        code("""
guess.reveal(marker["tensor_bytes"] / psi,
             "4 bytes of parameter and 8 of Adam's two moments; the gradients are not saved (the next step makes them"
             ' anew).')
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
import math

def young_daly_figure(checkpoint_s=30.0, machine_mtbf_days=365.0, machines=1000):
    mtbf = machine_mtbf_days * 86400 / machines
    best = formulas.young_daly_interval(checkpoint_s, mtbf)
    taus = [best * 0.2 * 1.1 ** i for i in range(52)]          # τ*/5 … ≈ 28 τ*: the bowl and its sides
    lost = [100 * formulas.checkpoint_overhead(t, checkpoint_s, mtbf) for t in taus]
    at_best = 100 * formulas.checkpoint_overhead(best, checkpoint_s, mtbf)
    top = min(max(lost), 4 * at_best)                            # the bowl, not the 1/τ wall beside it
    fig = go.Figure(go.Scatter(x=[t / 60 for t in taus], y=lost, name="time lost", line={"color": "#4C78A8"}))
    fig.add_trace(go.Scatter(x=[best / 60] * 2, y=[0, top], mode="lines", name="τ*",
                             line={"dash": "dash", "color": "#E45756"}))
    # on a log axis an annotation's x is log10 of the value (a plain x would be read as a power of ten)
    fig.add_annotation(x=math.log10(best / 60), y=top, text=f"τ* = {best / 60:.1f} min: {at_best:.1f} % lost",
                       showarrow=False, yanchor="bottom", font={"color": "#E45756"})
    fig.update_layout(title=f"job MTBF {mtbf / 3600:.1f} h: time lost against the checkpoint interval",
                      xaxis={"type": "log", "title": "interval (min, log)",
                             "range": [math.log10(taus[0] / 60), math.log10(taus[-1] / 60)]},
                      yaxis={"title": "time lost (%)", "range": [0, 1.15 * top]}, height=350, showlegend=False)
    return fig

young_daly_figure().show()
widgets.interact(lambda checkpoint_s, machine_mtbf_days, machines:
                 young_daly_figure(checkpoint_s, machine_mtbf_days, machines).show(),
                 checkpoint_s=widgets.SelectionSlider(options=[1, 3, 10, 30, 100, 300, 1000], value=30,
                                                      description="δ (s)"),
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
viz.check("the restarted run's losses equal an uninterrupted run's, exactly", "restarted == uninterrupted",
          restarted=table.loss, uninterrupted=table.uninterrupted)
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
KINDS = {"step, attempt 0": "#4C78A8", "step, attempt 1": "#54A24B", "checkpoint save": "#FF9DA6"}
bars = {k: {"x": [], "y": [], "base": [], "text": []} for k in KINDS}
for e in both:
    if e.get("ph") == "X" and (e["name"].startswith("ProfilerStep") or e.get("cat") == "checkpoint"):
        kind = ("checkpoint save" if e.get("cat") == "checkpoint"
                else "step, attempt 1" if e["ts"] >= restart else "step, attempt 0")
        b = bars[kind]
        b["x"].append(e["dur"] / 1e3); b["y"].append(f"rank {e['pid']}"); b["base"].append(e["ts"] / 1e3)
        b["text"].append(f"{e['name']}: {e['dur'] / 1e3:.0f} ms")
for kind, b in bars.items():
    fig.add_trace(go.Bar(x=b["x"], y=b["y"], base=b["base"], orientation="h", name=kind, marker_color=KINDS[kind],
                         hovertext=b["text"], hoverinfo="text"))
fig.add_vline(x=restart / 1e3, line_dash="dash", annotation_text="restart 1")
fig.update_layout(barmode="overlay", height=320, xaxis_title="ms since the first attempt started",
                  title="both attempts on one timeline (the first save is the longest: DCP sets up its writers)")
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
viz.check("only step 3 is skipped", "list(np.flatnonzero(skipped)) == [3]", skipped=list(nan.metrics.skipped))
nan.metrics[["step", "loss", "grad_norm", "skipped"]].astype({"grad_norm": object}).fillna({"grad_norm": "non-finite"})
"""),
        md("""
## A loss spike, skipped

Large runs see sudden loss spikes — a bad batch, an optimizer state gone wrong, a flipped bit — and one
update taken on such a step can set training back by thousands of steps. What large runs published is
coarser than a per-step guard: PaLM (Chowdhery et al. 2022) restarted from a checkpoint about 100 steps before
a spike and skipped the 200–500 batches around it; OPT's logbook records restarts from an earlier checkpoint
with a lower learning rate. The guard here is **the workbench's own heuristic**, a cheap cousin of theirs: it
compares each step's loss with the recent ones and skips the update when it jumps.
`loss_spike_factor=2.0` skips any step whose loss is more than twice the median of the steps before it.
Here rank 1's loss (and so its gradients) is multiplied by 10 at step 4
(`fault="loss-spike"`): the global loss, all-reduced before the update, jumps on every rank, and all of
them skip that update together — the weights and Adam's state stay as they were.
"""),
        code("""
spike = run("loss-spike", dp=2, steps=6, loss_spike_factor=2.0, fault="loss-spike", fault_rank=1, fault_step=4)
m = spike.metrics
viz.check("the spike at step 4 is skipped, and only it", "list(np.flatnonzero(skipped)) == [4]",
          skipped=list(m.skipped), loss_at_4=m.loss[4], median_before=m.loss[:4].median())
fig = go.Figure(go.Scatter(x=m.step, y=m.loss, mode="lines+markers", name="loss", line={"color": "#4C78A8"}))
fig.add_trace(go.Scatter(x=m.step[m.skipped], y=m.loss[m.skipped], mode="markers", name="update skipped",
                         marker={"symbol": "x", "size": 14, "color": "#E45756"}))
fig.update_layout(title="a loss spike (rank 1 × 10 at step 4): every rank skips that update", height=320,
                  xaxis_title="step", yaxis_title="loss")
fig.show()
m[["step", "loss", "skipped", "anomaly"]].fillna({"anomaly": "—"})
"""),
        md("""
## A straggler, found

A rank that is slow but not dead — a GPU throttling on heat, a noisy neighbour, a slow disk — hangs no
collective, so no timeout fires: the whole job just runs at the straggler's pace, because in a
synchronous step everyone waits for the slowest. Rank 1 sleeps 40 ms in every step from step 1
(`fault="straggle"`). `workbench doctor` on the finished run reads each rank's own time (compute, and
time outside compute and communication) and its time waiting in collectives, and names the rank the
others wait for.
"""),
        code("""
straggler = run("straggle", dp=2, steps=5, fault="straggle", fault_rank=1, fault_step=1, fault_delay_s=0.04)
straggle_report = diagnose(straggler.path)
print(straggle_report)
viz.check("doctor names rank 1 as the straggler", "'straggler: rank 1' in verdict",
          verdict=next((line.strip() for line in straggle_report.splitlines() if "straggler:" in line), ""))
viz.timeline(straggler, steps=[3], title="rank 0 waits in the all-reduce (wait row) while rank 1 sleeps").show()
"""),
        md("""
## A hang, diagnosed

Rank 1 stops answering in step 1 (it sleeps). Rank 0 waits in its first collective of that step until the
process-group timeout (5 s here), fails naming the operation, and torchrun stops rank 1. Each rank's
error file keeps its flight recorder — its last collectives, with their per-group sequence numbers —
and `workbench doctor RUN` lines them up: who was blocked where, and who never got there.
"""),
        code("""
import time
from workbench.comm.torch_flight_recorder import behind as torch_behind, read_dumps

started = time.time()
try:
    run("hang", dp=2, steps=4, fault="hang", fault_rank=1, fault_step=1, timeout_s=5)
except wb.RunFailed as e:
    failed, report = e, diagnose(e.run.path)
print(report)
viz.check("the job ends within seconds, rank 0's error naming the operation and its group",
          "seconds < 60 and rank == 0 and 'all_reduce' in error and 'group dp' in error",
          seconds=time.time() - started, rank=failed.rank,
          error=str(failed).split(" — ")[0])
viz.check("doctor names rank 1 as the one behind", "'behind: rank 1' in verdict",
          verdict=next((line.strip() for line in report.splitlines() if "behind:" in line), ""))
torch_view = [g for g in torch_behind(read_dumps(failed.run.path)) if g["group"] == "dp [0, 1]"]
viz.check("torch's own flight recorder, dumped by both ranks, says the same",
          "list(behind) == [1]", behind=torch_view[0]["behind"] if torch_view else []);
"""),
        md("""
## Elastic: a machine leaves, and comes back

With `--nnodes MIN:MAX` torchrun runs *elastic* membership: the job goes on while at least MIN machines
take part. When one is lost, the others' agents notice, stop their ranks and form a new, smaller group;
the run resumes from the newest checkpoint with data parallelism over the ranks that are left (the
global batch the same, each rank's share larger). When the machine returns, the group re-forms at full
size. Below, two "machines" on this one (two `workbench run` agents, one rank each, meeting at a c10d
rendezvous endpoint): the second is killed after step 4, and started again once the first goes on alone.
Rank 0 sleeps 0.2 s per step (`straggle`) so that the run lasts long enough for the second machine to
come back. `metrics.jsonl` records each step's world size and attempt.

The c10d rendezvous keeps its state in one store, served by whoever opened the endpoint first. Lose the
machine that hosts the store and every agent loses the rendezvous with it, so on a real cluster the endpoint
is a machine that stays (a head node, or an etcd service), not one that may leave. Here that machine is this
notebook: it opens the store (torch's `TCPStore`), and each agent, finding the endpoint taken, joins it as a
client. The second machine starts as soon as the first has prepared the run's directory (its `request.json`):
an agent that finds the same request there joins the run, one that came before it would find the directory
locked by the first and be refused. Both then reach the first round — which closes 2 s after its first agent
joins (`last_call_timeout`), so a machine that started seconds later would only join the next one.
"""),
        code("""
import shutil, signal, subprocess, sys, time

ELASTIC = os.path.abspath(os.path.join(OUT, "elastic"))
shutil.rmtree(ELASTIC, ignore_errors=True)
from torch.distributed import TCPStore

# the rendezvous store, on the machine that stays (this notebook's), at a free port
store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
endpoint = f"127.0.0.1:{store.port}"

def machine():  # one machine's agent: the same `workbench run` on each, meeting at the rendezvous endpoint
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", "run", "--model", "tiny", "--dp", "2",
                             "--steps", "24", "--checkpoint-every", "2", "--max-restarts", "3", "--timeout", "30",
                             "--fault", "straggle", "--fault-delay-s", "0.2", "--nnodes", "1:2",
                             "--rdzv-endpoint", endpoint, "--out", ELASTIC, "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

def rows():
    try:
        return [json.loads(line) for line in open(os.path.join(ELASTIC, "metrics.jsonl")) if line.strip()]
    except (OSError, json.JSONDecodeError):
        return []

def wait_for(what, done, timeout_s=120):
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout_s} s for {what}")
        time.sleep(0.2)

first = machine()
# the second joins the run the first prepared (the same request.json there); started before that file exists,
# it would find the directory locked by the first and be refused (launching/run_lock.py)
wait_for("the first machine's request", lambda: os.path.exists(os.path.join(ELASTIC, "request.json")), 60)
second = machine()
wait_for("steps on two machines", lambda: any(r["world_size"] == 2 and r["step"] >= 4 for r in rows()))
before = max(r["attempt"] for r in rows())
second.kill()          # the machine goes: its agent, then (parent-death signals) its torchrun and rank
second.wait()
# three steps of the survivors' own attempt: one of them ends on a checkpoint (every 2 steps), so the rejoined
# run resumes after it and keeps them (rows of an earlier attempt on one machine would not show they went on)
wait_for("the run to go on with one machine",
         lambda: sum(r["world_size"] == 1 and r["attempt"] > before for r in rows()) >= 3)
second = machine()     # it comes back
for agent in (first, second):
    out, _ = agent.communicate(timeout=240)
    viz.check("the agent finished the run", "exit_code == 0", exit_code=agent.returncode)
elastic = pd.DataFrame(rows())[["step", "world_size", "attempt", "loss"]]
worlds = list(elastic.world_size)
phases = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
viz.check("two machines, then one, then two again", "list(world_sizes) == [2, 1, 2]", world_sizes=phases)
viz.check("every step once, redone steps replacing the lost ones", "list(steps) == list(range(24))",
          steps=list(elastic.step))
# the same request without the machine lost: the same global batch each step, split over the ranks there are
whole = wb.launch(wb.RunConfig(model="tiny", dp=2, steps=24), out=os.path.join(OUT, "elastic-uninterrupted"),
                  force=True)
gap = (elastic.loss - whole.metrics.loss).abs() / whole.metrics.loss
viz.check("the losses equal the uninterrupted run's within 1e-5 relative (fp32 sums in another order)",
          "relative_difference <= 1e-5", relative_difference=gap);
"""),
        code("""
fig = go.Figure(go.Scatter(x=elastic.step, y=elastic.world_size, mode="lines+markers", line={"shape": "hv"},
                           name="ranks in the group", marker={"color": elastic.attempt, "colorscale": "Viridis",
                                                              "size": 9, "showscale": True,
                                                              "colorbar": {"title": "attempt"}}))
fig.update_layout(title="elastic membership: the group's size at each step (colour: the attempt)", height=320,
                  xaxis_title="step", yaxis={"title": "ranks", "dtick": 1, "range": [0, 2.5]})
fig.show()
elastic
"""),
        md("""
The steps done before the loss and not yet saved are redone by the smaller group (from the newest
checkpoint); every step's loss is that of a run that never changed size, up to the order in which fp32
sums are taken — the same global batch, split over whatever data-parallel ranks the group has.
"""),
        md("""
## On GPUs: what else fails, and who notices

Everything above runs on this CPU. A GPU cluster adds failures a CPU does not have, and tools to see them
(none of which run here):

- **The NCCL watchdog.** NCCL's collectives run on the GPU, asynchronously; a collective that never
  completes is noticed by a watchdog thread in each process (`TORCH_NCCL_ASYNC_ERROR_HANDLING`), which
  aborts the communicator after the process group's timeout and — with `TORCH_NCCL_DUMP_ON_TIMEOUT` —
  writes torch's flight recorder (`workbench doctor` reads those dumps beside ours, as above).
- **Xid errors.** The NVIDIA driver logs GPU faults as numbered Xid events in the kernel log (`dmesg`):
  Xid 79 (the GPU fell off the bus), 48 and 63/64 (ECC memory errors, page retirement), 31 (a memory
  page fault in a kernel), 13 (graphics engine exception). Some need only the job restarted, some a GPU
  reset or the machine drained.
- **ECC errors.** Single-bit errors are corrected and counted; double-bit errors are not correctable
  and kill the process using that memory. A rising corrected-error count is an early warning.
- **Health monitoring.** `nvidia-smi` (temperature, power, clocks, throttle reasons, ECC counts),
  NVML (the library under it, for programs) and **DCGM** (NVIDIA's Data Center GPU Manager: fleet-wide
  health checks, diagnostics, metrics for Prometheus) watch the GPUs while jobs run; a scheduler drains a
  machine whose GPUs report errors before the job lands on it again.

What this notebook shows on a CPU — restart from a checkpoint, a skipped bad step, a hang diagnosed, a
straggler named — is the same machinery a GPU job relies on; the GPU-only signals above feed into it.
"""),
    ],
    "08_fault_tolerance.ipynb",
)
