"""Step time, predicted from per-action costs (predict/action_costs.py): the pipeline schedule run by
the simulator with those costs, the data-parallel gradients' buckets overlapped with the last backward,
the optimizer, and a fixed cost per step.

    predict_step(Layout(model=cfg, dp=2, tp=2, pp=2, m=4, micro=2), hardware) -> StepTime

- no pipeline: m · (forward + backward) of the rank's one stage;
- a pipeline: pipeline.simulate with each stage's forward and backward cost, α_p2p + activation bytes /
  β per transfer, under the backend's rule (NCCL's or gloo's) — the bubble comes out of the schedule,
  uneven first and last stages included, instead of the formula's (p − 1)/(v·m + p − 1); DualPipe's
  stages are each 1/p of a copy of the model and run half the microbatches, an F&B pair costs its F
  plus its B (no overlap modelled), and the twin copies' gradients cross the pipeline's link once after
  backward (`_twin_gradients`);
- ZeRO-3: each layer's all-gather before its forward and its backward, and its gradients'
  reduce-scatter, inside the actions (α + bytes / β each);
- data parallel (Li et al. 2020, PyTorch DDP): buckets of `bucket_mb`, ready as the last micro-batch's
  backward produces them (last layers first) and reduced one after another — what outlasts that
  backward is exposed; ZeRO-1 reduce-scatters after backward, ZeRO-1/2 all-gather the parameters
  after the update;
- the optimizer: a cost per value and per tensor it updates (ZeRO: the 1/N slice);
- a step's fixed cost (zero_grad, the loss's all-reduce, recording), and one α per small collective.

`StepTime.terms` holds what each adds (rank 0's path); `dominant` names the largest. No torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from workbench.predict.action_costs import (
    CostContext,
    Layout,
    _collective,
    _ends,
    cost_context,
    layer_costs,
)
from workbench.predict.formulas import params_per_rank, placement_of
from workbench.predict.formulas.run import carried, stage_shape
from workbench.schedules.build import Action, Schedule, build_schedule, simulate

TERMS = ("compute", "overhead", "tp", "cp", "ep", "zero3", "pipeline", "dp", "optimizer", "step")


@dataclass
class StepTime:
    total_s: float
    terms: dict[str, float] = field(default_factory=dict)  # seconds each term adds to rank 0's step

    @property
    def dominant(self) -> str:
        return max(self.terms, key=lambda k: self.terms[k])

    def to_dict(self) -> dict[str, Any]:
        return {"total_s": self.total_s, "terms": dict(self.terms), "dominant": self.dominant}


def shape(L: Layout) -> Schedule:
    """The layout's schedule without its actions (formulas/run.py's `stage_shape`)."""
    return stage_shape(L.schedule, L.pp, L.m, L.v)


def stage_costs(L: Layout, hw: Any, c: CostContext) -> list[dict[str, tuple[float, float]]]:
    """Per stage (pp · v of them): each term's (forward, backward) seconds for one micro-batch."""
    sched = shape(L)
    layer = layer_costs(L, hw, c)
    out = []
    for s in range(sched.stages):
        part, parts = sched.model_part(s)
        per_stage = L.model.layers // parts
        ends = _ends(L, hw, c, first=part == 0, last=part == parts - 1)
        cost = {
            k: (
                per_stage * layer[k][0] + ends.get(k, (0.0, 0.0))[0],
                per_stage * layer[k][1] + ends.get(k, (0.0, 0.0))[1],
            )
            for k in layer
        }
        # a pipeline action's own cost: detaching its input, posting transfers, recording
        if L.pp > 1:
            f, b = cost["overhead"]
            cost["overhead"] = (f + c.stretch * hw.action_fwd_s, b + c.stretch * hw.action_bwd_s)
        # each layer gathered before forward and backward; its gradients reduce-scattered
        if L.zero == 3:
            n = L.dp * L.cp  # ZeRO shards over dp×cp
            held = params_per_rank(L.model, tp=L.tp, pp=parts, virtual_stages=1, pp_rank=part)
            layer_bytes = held / max(per_stage, 1) * L.width
            launch = c.stretch * hw.launch_s  # each is launched asynchronously, then waited for
            gather = launch + _collective(c, layer_bytes, (n - 1) / n, c.beta_dp)
            scatter = launch + _collective(
                c, layer_bytes / L.width * L.grad_bytes, (n - 1) / n, c.beta_dp
            )
            cost["zero3"] = (per_stage * gather, per_stage * (gather + scatter))
        out.append(cost)
    return out


#: schedules with more actions than this are timed by the closed form instead of the simulator (the
#: planner tries thousands of layouts, GPT-3's with p = 12 and m = 192)
SIMULATE_UP_TO = 2000


def _pipeline(L: Layout, hw: Any, fwd: list[float], bwd: list[float], c: CostContext) -> float:
    """The step's compute span of the pipeline: the simulator's makespan with these costs; for large
    schedules the fill-and-drain bound: every stage once, then m − 1 more of the slowest (v chunks per
    rank: a rank's chunks are its stage's cost), each with its two transfers (activation in, gradient
    back), plus a transfer at each boundary each way to fill and drain."""
    seq = L.model.seq_len // L.cp // (L.tp if L.sequence_parallel else 1)
    t_comm = c.alpha_p2p + c.stretch * L.micro * seq * L.model.hidden * L.width / c.beta_pp
    if 2 * L.pp * L.v * L.m > SIMULATE_UP_TO:
        held = shape(L)
        share = carried(held) / L.m  # DualPipe: each stage runs half the microbatches
        per_rank = [
            share * sum(fwd[s] + bwd[s] for s in range(held.stages) if held.rank_of(s) == r)
            for r in range(L.pp)
        ]
        return (
            sum(per_rank) / L.v + (L.m - 1) * (max(per_rank) + 2 * t_comm) + 2 * (L.pp - 1) * t_comm
        )
    sched = build_schedule(L.schedule, L.pp, L.m, L.v)
    # posting its batches of transfers costs a rank host time between its actions, spread over them
    gap = []
    for r in range(L.pp):
        program = sched.program(r)
        actions = sum(isinstance(i, Action) for i in program)
        gap.append(c.stretch * hw.post_gap_s * (len(program) - actions) / max(actions, 1))

    def cost(r: int, item: Any) -> tuple[float, float]:
        if not isinstance(item, Action):
            return 0.0, 0.0
        # a split backward (zero-bubble): I and W each taken as half of B — the paper's T_I ≈ T_W
        share = {"F": fwd, "B": bwd}.get(item.kind)
        t = (share[item.stage] if share is not None else bwd[item.stage] / 2) + gap[r]
        return t, t

    return simulate(sched, cost=cost, t_comm=t_comm, rule=L.rule).makespan


def _twin_gradients(L: Layout, c: CostContext, local: float) -> float:
    """DualPipe: the seconds of each rank's exchange of its whole gradient with its twin's after backward
    (parallel/twin_grads.py), one transfer on the pipeline's link, exposed: nothing runs beside it."""
    if placement_of(L.schedule) != "dual" or L.pp == 1:
        return 0.0
    return c.alpha_p2p + c.stretch * local * L.grad_bytes / c.beta_pp


def _buckets(total_bytes: float, bucket_mb: float) -> list[float]:
    cap = bucket_mb * 1024 * 1024
    n = max(1, math.ceil(total_bytes / cap))
    return [min(cap, total_bytes - i * cap) for i in range(n)]


def _data_parallel(L: Layout, hw: Any, c: CostContext, local: float, window: float) -> float:
    """Exposed seconds of the gradients' reduction and ZeRO-1/2's parameter all-gather: the step's dp
    bytes on each link class (L.dp_link_bytes, or the ring's 2(n−1)/n · S) at that link's β, spread over
    the buckets in proportion to their size, α each."""
    n = L.dp * L.cp  # gradients reduce over dp×cp
    if n == 1 or L.zero == 3:
        return 0.0  # ZeRO-3 reduces layer by layer inside backward (stage_costs)
    grads = _buckets(local * L.grad_bytes, L.bucket_mb)
    ring = (
        2 * (n - 1) / n * local * L.grad_bytes
        if L.zero == 0
        else (n - 1) / n * local * (L.grad_bytes + L.width)
    )
    links = dict(L.dp_link_bytes) or {"dp": ring}
    beta = {"intra": c.beta_intra, "inter": c.beta_inter, "dp": c.beta_dp}
    seconds = c.stretch * sum(b / beta[k] for k, b in links.items())
    if L.zero == 1:  # reduce-scattered after backward, the parameters gathered after the update
        return seconds + 2 * len(grads) * c.alpha
    overlapped = seconds if L.zero == 0 else seconds * L.grad_bytes / (L.grad_bytes + L.width)
    end, done, total = 0.0, 0.0, sum(grads)
    # ready as backward produces them (last layers first), one after another on the wire
    for b in grads:
        done += b
        end = (
            max(window * done / total, end)
            + c.stretch * hw.launch_s
            + c.alpha
            + overlapped * b / total
        )
    exposed = max(0.0, end - window)
    if L.zero == 2:
        exposed += seconds - overlapped + len(grads) * c.alpha
    return exposed


def _optimizer(L: Layout, hw: Any, c: CostContext, local: float) -> float:
    values = local / (L.dp * L.cp if L.zero else 1)
    stages = L.pp * L.v
    tensors = (
        len(_buckets(local * L.grad_bytes, L.bucket_mb))
        if L.zero
        else 12 * L.model.layers // L.pp * (2 if placement_of(L.schedule) == "dual" else 1)
        + 2 * (1 if L.pp == 1 else 0)
        + 4 * (1 if stages == 1 else 0)
        + 2
    )
    per_value = (
        hw.optimizer_s_per_value if hw.optimizer_s_per_value is not None else 32 / hw.memory_bw
    )
    return c.stretch * (per_value * values + hw.optimizer_s_per_tensor * tensors)


def predict_step(L: Layout, hw: Any) -> StepTime:
    c = cost_context(L, hw)
    stages = stage_costs(L, hw, c)
    fwd = [sum(v[0] for v in st.values()) for st in stages]
    bwd = [sum(v[1] for v in st.values()) for st in stages]
    held = shape(L)
    mine = [s for s in range(held.stages) if held.rank_of(s) == 0]  # rank 0's stages
    runs = carried(held)  # the microbatches each stage runs (DualPipe's: half)
    terms = {k: runs * sum(sum(stages[s].get(k, (0.0, 0.0))) for s in mine) for k in TERMS[:6]}
    busy = sum(terms.values())
    local = params_per_rank(
        L.model,
        tp=L.tp,
        pp=L.pp,
        virtual_stages=L.v,
        ep=L.ep,
        placement=placement_of(L.schedule),
    )
    terms["pipeline"] = (
        _pipeline(L, hw, fwd, bwd, c) - busy + _twin_gradients(L, c, local) if L.pp > 1 else 0.0
    )
    # the loss; the gradient norm's parts
    small = (L.world > 1) + (L.zero > 0 or L.tp > 1 or L.pp > 1)
    terms["dp"] = _data_parallel(L, hw, c, local, bwd[0]) + small * c.alpha
    terms["optimizer"] = _optimizer(L, hw, c, local)
    terms["step"] = c.step_s
    return StepTime(sum(terms.values()), terms)
