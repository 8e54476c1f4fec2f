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

    return wb.launch(RunConfig.from_dict({**base, **change}), out=os.path.join(out, name), progress=False,
                     force=True)


def trimmed_mean(values: list[float], keep: float = 0.95) -> float:
    """The mean of the smallest `keep` share of the values (at least one)."""
    values = sorted(values)
    return statistics.mean(values[:max(1, int(len(values) * keep))])


def _pair_alpha(run: Any, beta: float) -> float:
    ev = _events(run, ("collective",))
    ev = ev[(ev.group == "tp") & (ev.op == "all_reduce")]
    return trimmed_mean(list((ev.dur_us / 1e6 - ev.bytes.fillna(0) / beta).clip(lower=0)))


def _p2p_alpha(run: Any) -> float:
    from workbench.analysis.bubble import transfer_time

    per_step = transfer_time(run.traces)
    return statistics.median(v for k, v in per_step.items() if k >= 1) / 1e6


def calibrate_in_runs(cfg: ModelConfig, hw: Any, worlds: tuple[int, ...], base: dict, out: str) -> Any:
    """`hw` (compute and bandwidth measured) completed from real runs of `base` (a RunConfig dict of the
    calibration model); their run directories under `out`. Sets `contention` (n, stretch, α, α, α_p2p,
    step's fixed cost) for each n in `worlds`, and the pipeline actions' own cost."""
    from workbench.predict.action_costs import Layout, _ctx
    from workbench.predict.step_time import predict_step, stage_costs

    pair = {w: _pair_alpha(_launch(base, out, f"tp2dp{w // 2}", tp=2, dp=w // 2), hw.intra_node_bw) for w in worlds}
    pp = _launch(base, out, "pp2", pp=2, microbatches=2)
    p2p = _p2p_alpha(pp) / pair[worlds[0]]
    rows = [(float(w), 1.0, pair[w], pair[w], p2p * pair[w]) for w in worlds]
    full = []
    run_two = None
    for w, _, a, b, p in rows:
        run = _launch(base, out, f"dp{int(w)}", dp=int(w))
        run_two = run_two or run
        L = Layout(cfg, dp=int(w), micro=base["global_batch"] // int(w))
        at_one = replace(hw, contention=((w, 1.0, a, b, p, 0.0),))
        st = stage_costs(L, at_one, _ctx(L, at_one))[0]
        fwd, bwd = _spans(run)
        stretch = max(1.0, (fwd + bwd) / sum(v[0] + v[1] for v in st.values()))
        trial = replace(hw, contention=((w, stretch, a, b, p, 0.0),))
        measured = float(run.metrics.step_time_s.iloc[1:].median())
        full.append((w, stretch, a, b, p, max(measured - predict_step(L, trial).total_s, 0.0)))
    hw = replace(hw, contention=tuple(full), launch_s=_launch_cost(run_two))
    return _pipeline_actions(cfg, hw, base, pp)


def _launch_cost(run: Any) -> float:
    """Host time to launch an asynchronous collective: the `launch` spans of a data-parallel run."""
    ev = _events(run, ("launch",))
    return trimmed_mean(list(ev.dur_us / 1e6)) if len(ev) else 0.0


def _post_gap(run: Any, stretch: float) -> float:
    """A pipeline rank's host time between its compute actions (not waiting) per batch it posts, at full
    speed: analysis.bubble's gaps of the `pp=2` run."""
    from workbench.analysis.bubble import _replicas, _step_inputs
    from workbench.pipeline.actions import Action
    from workbench.predict.formulas import run_schedule

    sched = run_schedule(run.config)
    per_batch = []
    for replica in _replicas(run.traces, sched.p):
        for step, inputs in _step_inputs(sched, replica).items():
            for r, gap in inputs["gap"].items():
                program = sched.program(r)
                actions = sum(isinstance(i, Action) for i in program)
                if step >= 1:
                    per_batch.append(gap * (actions - 1) / (len(program) - actions) / 1e6 / stretch)
    return statistics.mean(per_batch) if per_batch else 0.0


def _pipeline_actions(cfg: ModelConfig, hw: Any, base: dict, run: Any) -> Any:
    """The pipeline's own cost per action: a `pp=2` run's spans less the model's stage costs (the two
    stages' mean)."""
    from workbench.predict.action_costs import Layout, _ctx
    from workbench.predict.step_time import stage_costs

    L = Layout(cfg, pp=2, m=2, micro=base["global_batch"] // 2)
    costs = stage_costs(L, hw, _ctx(L, hw))
    fwd, bwd = _spans(run)
    pred_f = statistics.mean(sum(v[0] for v in st.values()) for st in costs)
    pred_b = statistics.mean(sum(v[1] for v in st.values()) for st in costs)
    return replace(hw, action_fwd_s=max(fwd - pred_f, 0.0), action_bwd_s=max(bwd - pred_b, 0.0),
                   post_gap_s=_post_gap(run, _ctx(L, hw).stretch))
