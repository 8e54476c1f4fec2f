"""Exercise `pipeline`: 1F1B (PipeDream-Flush, Narayanan et al. 2019; Megatron-LM's pipeline schedule) for
p = 4 ranks and m = 8 microbatches, written by the learner as a table of actions — a schedule is data
(schedules/actions.py), the shape torch.distributed.pipelining gives it.

The learner's `one_f_one_b` is a list of p rows, rank r's compute actions in the order it runs them:
"F3" is the forward of microbatch 3 through rank r's stage, "B3" its backward. The exercise wants p = 4 and
m = 8 (at m ≤ p GPipe holds what 1F1B holds); `try_schedule` takes any table of 2 to 4 ranks and up to 16
microbatches (a new schedule as data), trains it the same way and shows it beside 1F1B. Graded in three
stages:

- **before any process starts** (in this process, from the table alone): the cells are actions; each rank
  runs each microbatch's F and B once, the B after its F ("rank 3 never runs B7", "rank 1 runs F2 twice");
  and the table cannot deadlock — replayed with each F waiting for the activation from the rank before and
  each B for the gradient from the rank after, a table that stops names the cycle ("rank 0's B0 waits for
  B0's gradient from rank 1, which is waiting at F1 for F1's activation from rank 0"). Then the workbench
  places its sends and receives (schedules/placement.py, in lockstep) and `schedules.validate` proves it
  free of deadlock under NCCL's rule;
- on **real ranks**: the table, written as torch pipelining's CSV, trains the tiny model (4 layers, one
  per rank) for 3 steps (`RunConfig(schedule="csv:…")`), beside the workbench's own 1F1B at the same p and
  m (the reference) and one process with the same seed and global batch: the per-step losses and gradient
  norms must agree (tolerance: `LOSS_RTOL`);
- against the **target**: the activations rank 0 holds at once ≤ p microbatches — measured by the memory
  tracker: the activation counter's peak in a step over its value when the step's first forward ends, what
  one microbatch leaves on stage 0 — and the bubble at equal stage costs (the simulator on the table,
  T_B = 2·T_F) no more than 1F1B's (p − 1)/(m + p − 1). The bubble measured on this machine is shown beside
  it, not held: a tiny model's step is mostly Python between the actions.

GPipe (every F, then every B) is valid and trains right: only the measured memory (m microbatches on rank 0)
tells it from 1F1B.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.exercises.exercise import Exercise
from workbench.exercises.pipeline_table import check_table, forwards_before_backward, layers
from workbench.exercises.result import Result, Row
from workbench.schedules.actions import Schedule, peak_in_flight
from workbench.schedules.simulator import simulate

if TYPE_CHECKING:
    from workbench.analysis.run import Run
    from workbench.config import RunConfig

#: the ranks and microbatches the exercise asks for (try_schedule takes pipeline_table's RANKS, MICROBATCHES)
TASK_P, TASK_M = 4, 8
#: sequences per microbatch, and training steps of each run
MICRO_BATCH, STEPS = 2, 3
#: the one-process check (tests/test_pipeline_parallel.py, tests/test_data_parallel.py): the pipeline sums
#: each microbatch's gradient (scaled by 1/m) into .grad, one process computes the batch's in one pass — the
#: same numbers added in another order, so the last bits differ (measured: ≤ 1 ulp of the loss over 10
#: steps); a wrong gradient (a microbatch dropped or counted twice) moves the loss by ~1e-3 after one step
LOSS_RTOL, NORM_RTOL = 1e-5, 1e-4
#: what the held activations may exceed p by: the unit is one microbatch, so a schedule holding one more is
#: p + 1; the half only absorbs bookkeeping bytes (on the tiny model the peak is an exact multiple)
HELD_SLACK = 0.5
#: simulated stage costs: every stage alike, a backward twice a forward
T_F, T_B = 1.0, 2.0


def activations_held(run: Run) -> tuple[float, int, int]:
    """Measured on rank 0, over the run's steps: the most microbatches' activations held at once — the
    activation counter's peak in a step over its value when the step's first forward has ended (what one
    microbatch leaves on stage 0: the step starts with none) — with that peak and unit in bytes."""
    ev, mem = run.events, run.memory
    ev, mem = ev[ev["rank"] == 0], mem[mem["rank"] == 0]
    forwards = ev[(ev.lane == "schedule") & ev.name.str.fullmatch(r"\d+F\d+")]
    best = (0.0, 0, 0)
    for _, step in ev[ev.cat == "step"].iterrows():
        first = forwards[forwards.step == step.step].sort_values("start_us")
        within = mem[(mem.ts_us >= step.start_us) & (mem.ts_us <= step.end_us)]
        if first.empty or within.empty:
            continue
        unit = int(within[within.ts_us <= first.iloc[0].end_us].activation.max())
        peak = int(within.activation.max())
        if unit > 0 and peak / unit > best[0]:
            best = (peak / unit, peak, unit)
    return best


def _launch(config: RunConfig, out: str, *, reuse: bool) -> Run:
    """A run of `config` into `out`; the reference and the one-process run depend on p and m only, so a
    later check in this Python process reuses them (`reuse`) while their folder holds that same run."""
    from workbench.exercises.ranks import reused
    from workbench.launching.launcher import launch

    def run() -> Run:
        return launch(config, out=out, progress=False, force=True)

    if not reuse:
        return run()
    key = json.dumps([config.to_dict(), os.path.abspath(out)], sort_keys=True, default=str)
    return reused(key, os.path.join(out, "summary.json"), run)


def grade(solution: Any, out: str) -> Result:
    """The exercise: 1F1B at p = 4, m = 8 — validate the table, train with it beside 1F1B and one process,
    hold it to 1F1B's memory and bubble."""
    return _grade(solution, out, exercise=True)


def try_schedule(table: Any, out: str | None = None) -> Result:
    """A schedule of your own, as data (2–4 ranks, up to 16 microbatches): validated, trained beside 1F1B at
    the same p and m and one process; it passes when it trains what one process trains, and its memory and
    bubble are shown beside 1F1B's, not held."""
    return _grade(
        table,
        os.path.abspath(out or os.path.join("traces", "exercises", "schedule")),
        exercise=False,
    )


def _grade(solution: Any, out: str, *, exercise: bool) -> Result:
    from workbench.config import ConfigError, ModelConfig, RunConfig
    from workbench.exercises.ranks import EXERCISE_TIMEOUT_S, failure_message
    from workbench.launching.launcher import RunFailed
    from workbench.schedules.torch_csv import write_csv

    schedule, wrong = check_table(solution)
    if schedule is not None and exercise and (schedule.p, schedule.m) != (TASK_P, TASK_M):
        wrong = (
            f"the exercise asks for p = {TASK_P} ranks and m = {TASK_M} microbatches (F0 … F7); your table "
            f"has {schedule.p} rows and {schedule.m} microbatches (at m ≤ p GPipe and 1F1B hold the same "
            "activations, so only m = 8 tells them apart). A schedule of your own of another shape: "
            "wb.exercises.try_schedule(table)"
        )
        schedule = None
    if schedule is None:
        message = f"before any process started: {wrong}"
        return Result(exercise="pipeline", passed=False, stage="validate", message=message)
    p, m = schedule.p, schedule.m
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "your_schedule.csv")
    write_csv(schedule, path)
    base = RunConfig(
        model=ModelConfig(layers=layers(p)),
        global_batch=MICRO_BATCH * m,
        steps=STEPS,
        seed=0,
        backend="gloo",
        timeout_s=EXERCISE_TIMEOUT_S,
    )
    configs = {  # label → (its folder, its config)
        "yours": ("yours", base.replace(pp=p, microbatches=m, schedule=f"csv:{path}")),
        "reference": ("reference", base.replace(pp=p, microbatches=m, schedule="1f1b")),
        "one process": ("one_process", base),
    }
    try:
        runs = {
            label: _launch(
                c.replace(name=folder), os.path.join(out, folder), reuse=label != "yours"
            )
            for label, (folder, c) in configs.items()
        }
    except ConfigError as e:
        return Result(exercise="pipeline", passed=False, stage="validate", message=str(e))
    except RunFailed as e:
        return Result(exercise="pipeline", passed=False, stage="run", message=failure_message(e))
    return judge(runs, schedule, held=exercise)


@dataclass(kw_only=True)
class Figures:
    """What the check holds a table to: its run against one process (relative differences), the activations
    in flight (rank 0 measured: microbatches, its peak and unit in bytes; every rank counted from the table,
    beside 1F1B's p − r) and the bubble (simulated at equal costs, beside 1F1B's formula)."""

    loss: float
    norm: float
    held_0: float
    peak: int
    unit: int
    counted: list[int]
    one_f_one_b: list[int]
    bubble: float
    formula: float


def figures(runs: dict[str, Run], schedule: Schedule) -> Figures:
    p, m = schedule.p, schedule.m
    mine, one = runs["yours"].metrics, runs["one process"].metrics
    held_0, peak, unit = activations_held(runs["yours"])
    return Figures(
        loss=max(abs(a - b) / abs(b) for a, b in zip(mine.loss, one.loss, strict=True)),
        norm=max(abs(a - b) / abs(b) for a, b in zip(mine.grad_norm, one.grad_norm, strict=True)),
        held_0=held_0,
        peak=peak,
        unit=unit,
        counted=peak_in_flight(schedule),
        one_f_one_b=list(range(p, 0, -1)),
        bubble=simulate(schedule, t_f=T_F, t_b=T_B).bubble_fraction(),
        formula=(p - 1) / (m + p - 1),
    )


def rows(f: Figures, runs: dict[str, Run], p: int, *, held: bool) -> list[Row]:
    """The result's table; `held=False`: the targets shown, not held."""
    yours, reference = runs["yours"], runs["reference"]
    return [
        Row(
            what="loss vs one process, largest relative difference",
            yours=f.loss,
            target=f"≤ {LOSS_RTOL:g}",
            ok=f.loss <= LOSS_RTOL,
        ),
        Row(
            what="gradient norm vs one process, largest relative difference",
            yours=f.norm,
            target=f"≤ {NORM_RTOL:g}",
            ok=f.norm <= NORM_RTOL,
        ),
        Row(
            what="activations rank 0 holds at once, microbatches",
            yours=f.held_0,
            target=f"≤ p = {p} (1F1B's run: {activations_held(reference)[0]:.3g})",
            ok=f.held_0 <= p + HELD_SLACK if held else None,
            measured=True,
        ),
        Row(
            what="activations in flight on each rank, microbatches (counted from your table)",
            yours=f.counted,
            target=f"≤ 1F1B's p − r = {f.one_f_one_b}",
            ok=all(c <= t for c, t in zip(f.counted, f.one_f_one_b, strict=True)) if held else None,
        ),
        Row(
            what=f"bubble at equal stage costs (simulated, T_B = {T_B / T_F:g}·T_F)",
            yours=f.bubble,
            target=f"(p−1)/(m+p−1) = {f.formula:.4g}",
            ok=f.bubble <= f.formula + 1e-9 if held else None,
        ),
        Row(
            what="bubble fraction measured here (shown, not held: 4 ranks share 2 cores, a tiny model's "
            "step is mostly Python)",
            yours=yours.summary["bubble_fraction"]["measured"],
            target=reference.summary["bubble_fraction"]["measured"],
            ok=None,
            measured=True,
        ),
    ]


def judge(runs: dict[str, Run], schedule: Schedule, *, held: bool = True) -> Result:
    """The learner's run against one process, the activations in flight (counted from the table on every
    rank, measured on rank 0) and the simulated bubble; `held=False` (try_schedule): the last three shown
    beside 1F1B's, not held."""
    yours, reference = runs["yours"], runs["reference"]
    p, m = schedule.p, schedule.m
    f = figures(runs, schedule)
    loss, norm, held_0, peak, unit = f.loss, f.norm, f.held_0, f.peak, f.unit
    counted, one_f_one_b, bubble, formula = f.counted, f.one_f_one_b, f.bubble, f.formula
    same = loss <= LOSS_RTOL and norm <= NORM_RTOL
    table = rows(f, runs, p, held=held)

    def result(passed: bool, stage: str, message: str) -> Result:
        return Result(
            exercise="pipeline",
            passed=passed,
            stage=stage,
            message=message,
            rows=table,
            learner=yours,
            reference=reference,
        )

    if not same:
        return result(
            False,
            "one process",
            f"your schedule's run differs from one process (loss by {loss:.2g}, gradient norm by "
            f"{norm:.2g}, relative; at most {LOSS_RTOL:g} and {NORM_RTOL:g}) although your table "
            "validated: every microbatch's F and B ran once, in an order without deadlock, so the "
            "gradients should be one process's. Please report it with your table: the workbench's executor "
            "is the likely cause",
        )
    if not held:
        return result(
            True,
            "passed",
            f"your schedule is valid and trains what one process trains (losses within {loss:.1g} "
            f"relative). Beside 1F1B at p = {p}, m = {m}: activations in flight {counted} against "
            f"{one_f_one_b} (rank 0 measured: {held_0:.1f}), bubble at equal costs {bubble:.3f} against "
            f"{formula:.3f}",
        )
    before = forwards_before_backward(schedule)
    if held_0 > p + HELD_SLACK:
        return result(
            False,
            "target",
            f"your schedule trains the same model as one process, but rank 0 held {held_0:.1f} "
            f"microbatches' activations at once (measured: {peak} bytes at the peak, {unit} bytes per "
            f"microbatch on stage 0), and 1F1B holds at most p = {p}. Your rank 0 runs {before[0]} "
            f"forwards before its first backward (counted from your table, it holds {counted[0]}): 1F1B's "
            f"rank r runs only p − r of them (here {one_f_one_b}), then one backward, one forward in turn, "
            "so that each backward frees a microbatch's activations before the next forward saves another.",
        )
    over = [r for r in range(p) if counted[r] > one_f_one_b[r]]
    if over:
        r = over[0]
        return result(
            False,
            "target",
            f"your schedule trains right and rank 0 holds what 1F1B holds, but rank {r} has {counted[r]} "
            f"microbatches in flight at once (counted from your table) where 1F1B's rank r holds p − r = "
            f"{one_f_one_b[r]}: your ranks run {before} forwards before their first backward, 1F1B's "
            f"{one_f_one_b}. Each forward beyond them keeps one more microbatch's activations alive "
            "without shortening the step.",
        )
    if bubble > formula + 1e-9:
        tl = simulate(schedule, t_f=T_F, t_b=T_B)
        busy = [sum(e - b for _, b, e in rank) for rank in tl.spans]
        r = max(range(p), key=lambda q: tl.makespan - busy[q])
        return result(
            False,
            "target",
            f"your schedule trains right and holds {held_0:.1f} microbatches on rank 0, but at equal stage "
            f"costs it idles {bubble:.3f} of the step against 1F1B's (p−1)/(m+p−1) = {formula:.3f}: rank "
            f"{r} waits {tl.makespan - busy[r]:g} of {tl.makespan:g} time units (T_F = 1). Your ranks run "
            f"{before} forwards before their first backward; 1F1B's rank r runs p − r ({one_f_one_b}): "
            "fewer leaves the pipeline empty while ranks wait, and a rank that waits for its backward "
            "longer than 1F1B's order makes it stalls the ranks before it.",
        )
    return result(
        True,
        "passed",
        f"your schedule trains the same model as one process (losses within {loss:.1g} relative), rank 0 "
        f"held at most {held_0:.0f} microbatches' activations (measured), no rank holds more than 1F1B's, "
        f"and at equal stage costs its "
        f"bubble is 1F1B's (p−1)/(m+p−1) = {formula:.3f}",
    )


EXERCISE = Exercise(
    name="pipeline",
    title="1F1B for p = 4, as a table of actions",
    you_write="one_f_one_b: per rank, its forwards and backwards in order ('F0', 'B0', …)",
    target="rank 0 holds ≤ p microbatches' activations (measured); bubble (p−1)/(m+p−1) at equal costs",
    task=(
        "Write 1F1B (PipeDream-Flush: Narayanan et al. 2019; Megatron-LM's schedule) for p = 4 pipeline "
        "ranks and m = 8 microbatches, as data. Rank r holds layer r of the 4-layer model; "
        '`one_f_one_b[r]` lists rank r\'s compute actions in the order it runs them: `"F3"` is the '
        'forward of microbatch 3 through its layer, `"B3"` its backward. A forward waits for the '
        "activation rank r − 1's forward of that microbatch sends; a backward for the gradient rank r + 1's "
        "backward sends (the last rank's comes from its loss). The workbench places the sends and "
        "receives.\n\n"
        '```python\none_f_one_b = [\n    ["F0", "F1", ...],  # rank 0\n    ...\n]\n```\n\n'
        "Rules, checked before any process starts: each rank runs every microbatch's F and B once, the B "
        "after its F; and the table must not deadlock (the check names the ranks waiting on each other). "
        "Then it trains for 3 steps on 4 gloo ranks, beside the workbench's 1F1B and one process, whose "
        "losses it must match.\n\n"
        "Target: rank 0 holds at most p = 4 microbatches' activations at once (measured by the memory "
        "tracker: GPipe, every F then every B, holds 8); and at equal stage costs your table's bubble "
        "(simulated) is 1F1B's (p − 1)/(m + p − 1) = 3/11. The bubble measured here is shown beside it, "
        "not held: a tiny model's step is mostly Python. A schedule of your own (2 to 4 ranks, up to 16 "
        "microbatches) goes to `wb.exercises.try_schedule(table)`: validated, trained, and shown beside "
        "1F1B."
    ),
    stub=(
        "one_f_one_b = [\n"
        '    [],  # rank 0: e.g. "F0", "F1", …, "B0", …\n'
        "    [],  # rank 1\n"
        "    [],  # rank 2\n"
        "    [],  # rank 3\n"
        "]\n"
    ),
    grade=grade,
)
