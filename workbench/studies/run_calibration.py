"""The terms of the step-time model that only a real run shows, measured from the traces of short runs
of the calibration model on the run's backend:

- α, what one collective costs *inside a run* with n ranks (`tp=2, dp=n/2`): the mean tensor-parallel
  all-reduce less its bytes' time (the slowest 5 % left out: a rank descheduled) — a peer's skew,
  waking a process, the traced layer; the same α serves groups of any size (the few large-group
  collectives of a step cost about as much as a pair's on one host);
- a pipeline transfer's cost (`pp=2`): the median transfer time (analysis.bubble.transfer_time), scaled
  with n as α is; and a pipeline action's own cost beyond its layers (its forward and backward spans less
  the model's prediction of them: the executor's detaching, posting, recording);
- with n ranks (`dp=n`): the stretch of compute on shared cores (forward and backward spans over the
  prediction at full speed) and the step's fixed cost (the measured step less everything else
  predicted: zero_grad, the launcher's threads, the ranks' skew at the step's end).

No torch at import.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import replace
from typing import Any

from workbench.analysis.intervals import step_spread
from workbench.config import ModelConfig, RunConfig


def _events(run: Any, cats: tuple[str, ...]) -> Any:
    ev = run.events
    return ev[(ev.step >= 1) & ev.cat.isin(cats)]


def _spans(run: Any) -> tuple[float, float]:
    """Median forward and backward compute span, over ranks and steps after the first."""
    ev = _events(run, ("forward", "backward"))
    med = ev.groupby("cat").dur_us.median() / 1e6
    return float(med.get("forward", 0.0)), float(med.get("backward", 0.0))


def _launch(base: dict, out: str, name: str, **change: Any) -> Any:
    import workbench as wb

    return wb.launch(
        RunConfig.from_dict({**base, **change}),
        out=os.path.join(out, name),
        progress=False,
        force=True,
    )


def trimmed_mean(values: list[float], keep: float = 0.95) -> float:
    """The mean of the smallest `keep` share of the values (at least one)."""
    values = sorted(values)
    return statistics.mean(values[: max(1, int(len(values) * keep))])


def _pair_alpha(run: Any, beta: float) -> tuple[float, float]:
    """(α, κ): a tensor-parallel all-reduce costs α + κ · the rank's work since its previous collective —
    the ranks arrive apart by a share of the work each did alone (jitter grows with the work). Fitted
    over every such collective of the run but each step's first (which absorbs the step's entry skew,
    the step's fixed cost) and the slowest 5 % (a rank descheduled)."""
    from workbench.studies.compute_calibration import fit_line

    ev = run.events
    ev = ev[(ev.step >= 1) & (ev.cat == "collective")].sort_values("start_us")
    gaps, costs = [], []
    for _, rank in ev.groupby(["rank", "step"]):
        ends = rank.end_us.shift(1)
        tp = rank[(rank.group == "tp") & (rank.op == "all_reduce")].index
        for i in tp:
            if not ends.isna()[i]:
                gaps.append((rank.start_us[i] - ends[i]) / 1e6)
                costs.append(max(rank.dur_us[i] / 1e6 - (rank.bytes[i] or 0) / beta, 0.0))
    keep = sorted(range(len(costs)), key=costs.__getitem__)[: max(2, int(0.95 * len(costs)))]
    return fit_line([gaps[i] for i in keep], [costs[i] for i in keep])


def _p2p_alpha(run: Any) -> float:
    from workbench.analysis.bubble import transfer_time

    per_step = transfer_time(run.traces)
    return statistics.median(v for k, v in per_step.items() if k >= 1) / 1e6


def _runs(base: dict, out: str, worlds: tuple[int, ...], repeats: int) -> dict[str, list[Any]]:
    """The calibration runs, each `repeats` times round-robin (a slow minute of a shared machine then
    falls on one repeat of each, and the medians below leave it out)."""
    plan = {
        **{f"tp2dp{w // 2}": {"tp": 2, "dp": w // 2} for w in worlds},
        "pp2": {"pp": 2, "microbatches": 2},
        **{f"dp{w}": {"dp": w} for w in worlds},
    }
    runs: dict[str, list[Any]] = {name: [] for name in plan}
    for k in range(repeats):
        for name, change in plan.items():
            runs[name].append(_launch(base, out, f"{name}_{k}", **change))
    return runs


def _median_pair(fits: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(f[0] for f in fits), statistics.median(f[1] for f in fits)


def calibrate_in_runs(
    cfg: ModelConfig, hw: Any, worlds: tuple[int, ...], base: dict, out: str, *, repeats: int = 3
) -> Any:
    """`hw` (compute and bandwidth measured) completed from real runs of `base` (a RunConfig dict of the
    calibration model), each figure the median over `repeats` runs; their directories under `out`. Sets
    `contention` (n, stretch, α, α_p2p, step's fixed cost) and `skew` (n, κ) for each n in `worlds`,
    the launch cost and the pipeline actions' own cost."""
    from workbench.predict.action_costs import Layout, cost_context
    from workbench.predict.step_time import predict_step, stage_costs

    runs = _runs(base, out, worlds, repeats)
    fits = {
        w: _median_pair([_pair_alpha(r, hw.intra_node_bw) for r in runs[f"tp2dp{w // 2}"]])
        for w in worlds
    }
    p2p = statistics.median(_p2p_alpha(r) for r in runs["pp2"]) / fits[worlds[0]][0]
    hw = replace(
        hw,
        skew=tuple((float(w), fits[w][1]) for w in worlds),
        launch_s=statistics.median(_launch_cost(r) for r in runs[f"dp{worlds[0]}"]),
    )
    full = []
    for w in worlds:
        a = fits[w][0]
        L = Layout(model=cfg, dp=w, micro=base["global_batch"] // w)
        at_one = replace(hw, contention=((w, 1.0, a, p2p * a, 0.0),))
        st = stage_costs(L, at_one, cost_context(L, at_one))[0]
        stretch = max(
            1.0,
            statistics.median(sum(_spans(r)) for r in runs[f"dp{w}"])
            / sum(v[0] + v[1] for v in st.values()),
        )
        trial = replace(hw, contention=((w, stretch, a, p2p * a, 0.0),))
        measured = statistics.median(
            float(r.metrics.step_time_s.iloc[1:].median()) for r in runs[f"dp{w}"]
        )
        full.append(
            (float(w), stretch, a, p2p * a, max(measured - predict_step(L, trial).total_s, 0.0))
        )
    hw = replace(
        hw,
        contention=tuple(full),
        spread=measured_spread(
            [r for group in runs.values() for r in group], [group for group in runs.values()]
        ),
    )
    return _pipeline_actions(cfg, hw, base, runs["pp2"])


def measured_spread(runs: list[Any], groups: list[list[Any]]) -> float:
    """How much this machine moves: the larger of the median run's spread of its steps (after the first) and
    the median, over the runs repeated, of the half-range of their median steps over their median — what
    every predicted step time carries as ± (Estimate.step_time_spread_s)."""
    within = statistics.median(step_spread(list(r.metrics.step_time_s.iloc[1:])) for r in runs)
    medians = [
        [float(r.metrics.step_time_s.iloc[1:].median()) for r in g] for g in groups if len(g) > 1
    ]
    between = (
        statistics.median((max(m) - min(m)) / 2 / statistics.median(m) for m in medians)
        if medians
        else 0.0
    )
    return max(within, between)


def _launch_cost(run: Any) -> float:
    """Host time to launch an asynchronous collective: the `launch` spans of a data-parallel run."""
    ev = _events(run, ("launch",))
    return trimmed_mean(list(ev.dur_us / 1e6)) if len(ev) else 0.0


def _post_gap(run: Any, stretch: float) -> float:
    """A pipeline rank's host time between its compute actions (not waiting) per batch it posts, at full
    speed: analysis.bubble's gaps of the `pp=2` run."""
    from workbench.analysis.bubble import pipelines, step_inputs
    from workbench.predict.formulas import run_schedule
    from workbench.schedules.actions import Action

    sched = run_schedule(run.config)
    # per rank: gaps between its actions (actions − 1 of them) per batch it posts
    share = {
        r: (sum(isinstance(i, Action) for i in sched.program(r)) - 1)
        / sum(not isinstance(i, Action) for i in sched.program(r))
        for r in range(sched.p)
    }
    per_batch = [
        gap * share[r] / 1e6 / stretch
        for replica in pipelines(run.traces, sched.p)
        for step, inputs in step_inputs(sched, replica).items()
        if step >= 1
        for r, gap in inputs["gap"].items()
    ]
    return statistics.mean(per_batch) if per_batch else 0.0


def _pipeline_actions(cfg: ModelConfig, hw: Any, base: dict, runs: list[Any]) -> Any:
    """The pipeline's own cost per action: the `pp=2` runs' spans less the model's stage costs (the two
    stages' mean), and the host's gap per posted batch; medians over the runs."""
    from workbench.predict.action_costs import Layout, cost_context
    from workbench.predict.step_time import stage_costs

    L = Layout(model=cfg, pp=2, m=2, micro=base["global_batch"] // 2)
    costs = stage_costs(L, hw, cost_context(L, hw))
    pred_f = statistics.mean(sum(v[0] for v in st.values()) for st in costs)
    pred_b = statistics.mean(sum(v[1] for v in st.values()) for st in costs)
    fwd = statistics.median(_spans(r)[0] for r in runs)
    bwd = statistics.median(_spans(r)[1] for r in runs)
    return replace(
        hw,
        action_fwd_s=max(fwd - pred_f, 0.0),
        action_bwd_s=max(bwd - pred_b, 0.0),
        post_gap_s=statistics.median(_post_gap(r, cost_context(L, hw).stretch) for r in runs),
    )
