"""The zero-bubble schedules' arithmetic (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): the
bubble rate of each schedule at equal pass times, and the memory W's deferral costs. Plain arithmetic,
no torch.

Bubble rate (the paper's Table 2: a stage's idle time between its first and last pass, over its busy
time; `Timeline.bubble_rate` measures the same on a simulated or measured timeline), T_F = T_I = T_W:

    gpipe, 1f1b     (p − 1)/m          interleaved   (p − 1)/(v·m)
    zbh1            (p − 1)/3m         zbv           0 (m ≥ 2p)

The paper gives ZB-H1's as (p − 1)(T_F + T_I − T_W) / (m(T_F + T_I + T_W)) for other times too, for a
schedule re-planned for them (its automatic scheduler); the orders generated here are planned for equal
times, as its handcrafted ones are, so away from them the simulation (`pipeline.simulate` with the
costs) is the prediction: the bubble comes back on both sides of T_W = T_F (tests/test_zero_bubble.py).

DualPipe and DualPipeV (DeepSeek-V3, 2024; the deepseek-ai/DualPipe README's table), in time per rank
over a step, with PP pipeline stages and F, B, W the times of one stage's forward, full backward and
weight pass, F&B of an overlapped pair (F + B where nothing overlaps, as on one CPU thread):

    bubble      (PP/2 − 1)(F&B + B − 3W)     DualPipe: PP = p (each stage 1/p of a copy of the model)
                                             DualPipeV: PP = 2p (each stage half a rank's share)
    parameters  2 stages per rank: DualPipe 2× a p-stage pipeline's (two copies), DualPipeV 1× (2p halves)
    activations PP + 1 stages' worth of microbatches on the rank that holds the most

`dualpipe_bubble` is that idle time; the simulation at free transfers (`simulate(..., rule="gloo")`,
where a send never waits for its receive, as the formula assumes) gives it exactly for p = 2 … 8 in the
regime the schedule is planned for — T_F = T_I = T_W and B ≤ F&B ≤ F + B. Away from it the simulation is
the prediction and the formula departs from it both ways (tests/test_dualpipe.py): at DualPipe p = 4,
F = I = W = 1, F&B = 1.5 (below B) it idles 1.5 where the formula says 0.5; with W = 1.5, I = 0.5 it idles
2.0 where the formula says 0.5; with W = 0.5, I = 1.5 it idles 3.0 against the formula's 3.5.

The weight-gradient stash: from a microbatch's I until its W, each Linear keeps its input x and its
output gradient dy (pipeline/weight_grad.py), per token and layer of our GPT at tp = t:

    qkv (column)     x: h        dy: 3h/t
    attn.proj (row)  x: h/t      dy: h          (the partial sum before the reduction)
    mlp.fc (column)  x: h        dy: 4h/t       (r = 4: r·h/t in general)
    mlp.proj (row)   x: 4h/t     dy: h

→ (4h + (4 + 2r)·h/t) values, 16h at t = 1; the last stage adds the head's x: h and dy: V/t. Under
sequence parallelism the column-parallel layers keep their weight gradients in I (their own autograd
function), so only the rows stash: x (1 + r)·h/t and dy 2h.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.config import ModelConfig
from workbench.predict.formulas.comm import bubble_fraction
from workbench.schedules.actions import Schedule
from workbench.schedules.simulator import simulate

RATES = {
    "gpipe": "(p − 1)/m",
    "1f1b": "(p − 1)/m",
    "interleaved": "(p − 1)/(v·m)",
    "zbh1": "(p − 1)/3m",
    "zbv": "0",
    # DeepSeek's (PP/2 − 1)(F&B + B − 3W) over a rank's work, F&B = F + B (`dualpipe_rate`)
    "dualpipe": "(p − 2)/3m",
    "dualpipev": "(p − 1)/3m",
}


def dualpipe_bubble(stages: int, *, f: float, b: float, w: float, fb: float | None = None) -> float:
    """DeepSeek's bubble, (PP/2 − 1)(F&B + B − 3W): the idle time per rank over a step of DualPipe or
    DualPipeV with `stages` = PP pipeline stages, f, b, w one stage's forward, full backward and weight
    times, fb an F&B pair's (f + b unless given)."""
    if stages < 2 or stages % 2:
        raise ValueError(f"DualPipe's bubble needs an even number of stages ≥ 2, got {stages}")
    pair = f + b if fb is None else fb
    return (stages / 2 - 1) * (pair + b - 3 * w)


def dualpipe_rate(schedule: str, p: int, m: int) -> float:
    """DeepSeek's bubble as the zero-bubble paper's rate, at T_F = T_I = T_W and F&B = F + B (one thread:
    nothing overlaps): `dualpipe_bubble` over a rank's work. A stage's F costs 1 in DualPipe (1/p of a copy,
    a 1F1B stage) and 1/2 in DualPipeV (1/2p of the model); each rank runs 2 stages × m/2 microbatches
    (DualPipe) or 2 × m (DualPipeV) of F + I + W, 3m in all, so the rate is (p − 2)/3m for DualPipe
    (PP = p) and (p − 1)/3m for DualPipeV (PP = 2p) — ZB-H1's at p ranks, for DualPipeV. NaN where the
    schedule does not exist (m < 2p; DualPipe: p or m odd)."""
    if m < 2 * p or (schedule == "dualpipe" and (p % 2 or m % 2)):
        return float("nan")
    stages, f = (p, 1.0) if schedule == "dualpipe" else (2 * p, 0.5)
    return dualpipe_bubble(stages, f=f, b=2 * f, w=f) / (3.0 * m)


def bubble_rate(schedule: str, p: int, m: int, v: int = 1) -> float:
    """The paper's bubble rate of `schedule` at T_F = T_I = T_W (module docstring)."""
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / m
    if schedule == "interleaved":
        return (p - 1) / (v * m)
    if schedule == "zbh1":
        return (p - 1) / (3 * m)
    if schedule == "zbv":
        return 0.0 if m >= 2 * p else float("nan")
    if schedule in ("dualpipe", "dualpipev"):
        return dualpipe_rate(schedule, p, m)
    raise ValueError(f"no bubble-rate formula for schedule {schedule!r}; valid: {sorted(RATES)}")


#: the DualPipe README's table ("based on the same number of PP stages"): per device, parameters in a
#: PP-stage 1F1B device's, activations in stage-microbatches beyond PP
PUBLISHED = {"1f1b": (1, 0), "zbh1": (1, 0), "dualpipe": (2, 1), "dualpipev": (2, 1)}


@dataclass(frozen=True, kw_only=True)
class PipelineMemory:
    """A schedule's memory per rank as DeepSeek's table gives it, in our units, beside what our generated
    schedule holds (`in_flight`)."""

    schedule: str
    p: int  # ranks
    stages: int  # PP: the pipeline's stages (DualPipe: p per copy; DualPipeV: 2p; 1F1B, ZB-H1: p)
    #: per rank, in a p-rank 1F1B rank's parameters: DeepSeek's 2× of a PP-stage device's is 2 for
    #: DualPipe (two copies' parts) and 1 for DualPipeV (two half-stages)
    parameters: float
    activations: (
        int  # DeepSeek's: stage-microbatches the busiest rank holds at its peak (PP + 1; 1F1B: PP)
    )
    stage_share: float  # one stage's share of the model (of one copy): 1/PP
    #: ours: per rank, the most stage-microbatches whose forward ran and whose I (or B) has not
    #: (`peak_in_flight` of the generated schedule); None without m
    in_flight: list[int] | None = None

    @property
    def activation_share(self) -> float:
        """DeepSeek's activations in whole-model microbatches, activations × stage_share: 1 for 1F1B (p
        stages of 1/p), (p + 1)/p for DualPipe, (2p + 1)/2p for DualPipeV."""
        return self.activations * self.stage_share


def deepseek_memory(schedule: str, p: int, m: int | None = None) -> PipelineMemory:
    """DeepSeek's per-rank memory of `schedule` over p ranks (the DualPipe README's table) in our units,
    with our schedule's peak in flight beside it when m is given. DualPipe and DualPipeV hold PP + 1
    stage-microbatches — ours on every rank, for every p and m tried (tests/test_dualpipe.py): the F of an
    F&B pair runs before its B releases the other microbatch (counted B first, all but the ranks at the
    fold — DualPipeV's last, DualPipe's middle two — would hold PP); 1F1B and ZB-H1 PP on their first rank."""
    if schedule not in PUBLISHED:
        raise ValueError(
            f"DeepSeek's table has no {schedule!r}; valid: {', '.join(sorted(PUBLISHED))}"
        )
    from workbench.schedules.build import build_schedule, peak_in_flight

    stages = 2 * p if schedule == "dualpipev" else p
    factor, extra = PUBLISHED[schedule]
    return PipelineMemory(
        schedule=schedule,
        p=p,
        stages=stages,
        parameters=factor * p / stages,
        activations=stages + extra,
        stage_share=1 / stages,
        in_flight=None if m is None else peak_in_flight(build_schedule(schedule, p, m)),
    )


def schedule_bubble_fraction(s: Schedule) -> float:
    """The idle share of a step (`Timeline.bubble_fraction`, the summary's `predicted`) at equal costs and
    free transfers: (p − 1)/(v·m + p − 1) for the schedules without a split backward; for those with one,
    their simulation at T_F = T_I = T_W (the formula's world, no closed form needed), where a send never
    waits for its receive (rule "gloo"), as the papers' formulas assume: ZB-H1 and ZBV give the same under
    NCCL's rule, DualPipe and DualPipeV do not (their lockstep rounds post receives a later pair needs in
    the batch before an earlier pair, and an NCCL group finishes as one: DualPipeV's p = 4, m = 8 step
    takes 30 units instead of 27) — a run's `uneven_stage_costs` term holds that where it runs on NCCL."""
    if not any(a.kind == "I" for rank in s.actions for a in rank):
        return bubble_fraction(s.p, s.m, s.v)
    return simulate(s, t_f=1.0, t_b=2.0, t_w=1.0, rule="gloo").bubble_fraction()


def named_bubble_fraction(schedule: str, p: int, m: int, v: int = 1) -> float:
    """`schedule_bubble_fraction` by the schedule's name (0 without a pipeline)."""
    if p == 1:
        return 0.0
    if schedule in ("gpipe", "1f1b", "interleaved"):
        return bubble_fraction(p, m, v)
    from workbench.schedules.build import build_schedule  # only a split backward needs it

    return schedule_bubble_fraction(build_schedule(schedule, p, m, v))


def wgrad_stash_bytes(
    cfg: ModelConfig,
    micro_batch: int,
    *,
    layers: int,
    last: bool,
    bytes_per_value: int = 4,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Bytes one microbatch's I leaves stashed for its W on a stage of `layers` blocks (`last`: with the
    head)."""
    h, f, t, tokens = cfg.hidden, cfg.inner, tp, cfg.seq_len * micro_batch
    if sequence_parallel and t > 1:
        per_layer = (h / t + f / t) + 2 * h  # the row-parallel layers only
        head = 0.0
    else:  # each linear's input x and output gradient dy: qkv, proj, fc (SwiGLU: gate and up), proj
        per_layer = (h + h / t + h + f / t) + (cfg.qkv_width / t + h + cfg.mlp_in_width / t + h)
        head = h + cfg.vocab_size / t
    return bytes_per_value * tokens * (layers * per_layer + (head if last else 0.0))
