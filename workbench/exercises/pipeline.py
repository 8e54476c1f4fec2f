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
import re
from typing import TYPE_CHECKING, Any

from workbench.exercises.exercise import Exercise
from workbench.exercises.result import Result, Row
from workbench.schedules.actions import Schedule, peak_in_flight
from workbench.schedules.placement import schedule_from_orders
from workbench.schedules.simulator import simulate
from workbench.schedules.validation import validate

if TYPE_CHECKING:
    from workbench.analysis.run import Run
    from workbench.config import RunConfig

#: the ranks and microbatches a table may have (`try_schedule`), and the exercise's own
RANKS, MICROBATCHES = range(2, 5), range(1, 17)
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

_ACTION = re.compile(r"^([FB])(\d+)$")


class TableError(ValueError):
    """A table that is not a schedule: the message names the rank, the cell and what is valid."""


def layers(p: int) -> int:
    """The tiny model's layers for p ranks: 4, split evenly (3 for p = 3)."""
    return p * max(1, 4 // p)


def parse(table: Any) -> list[list[tuple[str, int]]]:
    """Each rank's actions as (F or B, microbatch); TableError naming the first bad row or cell."""
    if not isinstance(table, list | tuple) or not all(isinstance(r, list | tuple) for r in table):
        raise TableError(
            f"one_f_one_b must be a list of p lists, one per rank, of actions like 'F0', 'B0'; got "
            f"{type(table).__name__}"
            + ("" if not isinstance(table, list | tuple) else " holding a non-list row")
        )
    if len(table) not in RANKS:
        raise TableError(
            f"your table has {len(table)} row{'s' * (len(table) != 1)}: one per pipeline rank, "
            f"{RANKS[0]} to {RANKS[-1]} (the task: 4)"
        )
    orders = []
    for r, row in enumerate(table):
        if not row:
            raise TableError(f"rank {r}'s row is empty: every rank runs each microbatch's F and B")
        orders.append([_action(r, i, cell) for i, cell in enumerate(row)])
    m = 1 + max(mb for order in orders for _, mb in order)
    if m not in MICROBATCHES:
        raise TableError(
            f"your table runs microbatch {m - 1}: this exercise trains with up to "
            f"{MICROBATCHES[-1]} microbatches (0 … {MICROBATCHES[-1] - 1}; the task: 8)"
        )
    return orders


def _action(rank: int, i: int, cell: Any) -> tuple[str, int]:
    match = _ACTION.match(cell.strip()) if isinstance(cell, str) else None
    if match is not None:
        return match[1], int(match[2])
    hint = ""
    if isinstance(cell, str) and re.match(r"^\d+[FB]\d+$", cell.strip()):
        hint = f" (the row is the rank: write {cell.strip().lstrip('0123456789')!r})"
    elif isinstance(cell, str) and re.match(r"^[IW]\d+$", cell.strip()):
        hint = " (this exercise runs whole backwards, B; zero bubble's I and W are not taken)"
    elif isinstance(cell, str) and re.match(r"^[fb]\d+$", cell.strip()):
        hint = f" (capitals: {cell.strip().upper()!r})"
    raise TableError(
        f"rank {rank}, cell {i}: {cell!r} is not an action{hint}; valid: 'F' or 'B' and a microbatch "
        "number, e.g. 'F3' (forward of microbatch 3) or 'B0' (backward of microbatch 0)"
    )


def coverage_problems(orders: list[list[tuple[str, int]]]) -> list[str]:
    """Each rank runs every microbatch's F and B once, the B after its F: what does not, in rank order."""
    m = 1 + max(mb for order in orders for _, mb in order)
    problems = []
    for r, order in enumerate(orders):
        for kind in ("F", "B"):
            for mb in range(m):
                n = order.count((kind, mb))
                if n != 1:
                    times = {0: "never runs", 2: "runs"}.get(n, "runs")
                    count = {0: "", 2: " twice"}.get(n, f" {n} times")
                    problems.append(f"rank {r} {times} {kind}{mb}{count}")
        for mb in range(m):
            if ("B", mb) in order and ("F", mb) in order:
                if order.index(("B", mb)) < order.index(("F", mb)):
                    problems.append(
                        f"rank {r} runs B{mb} before F{mb}: a backward needs the activations its "
                        "forward saved"
                    )
    return problems


def _source(p: int, r: int, kind: str) -> int | None:
    """The rank whose action of the same name this one waits for (None: the pipeline's end)."""
    src = r - 1 if kind == "F" else r + 1
    return src if 0 <= src < p else None


def deadlock(orders: list[list[tuple[str, int]]]) -> str | None:
    """Replay the table with each F waiting for the rank before's F, each B for the rank after's B (the
    transfers as unbounded queues): None if every rank finishes, else the cycle of ranks waiting on each
    other, named action by action."""
    p = len(orders)
    pos, done = [0] * p, [set[tuple[str, int]]() for _ in range(p)]
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, mb = orders[r][pos[r]]
                src = _source(p, r, kind)
                if src is not None and (kind, mb) not in done[src]:
                    break
                done[r].add((kind, mb))
                pos[r], moved = pos[r] + 1, True
    if all(pos[r] == len(orders[r]) for r in range(p)):
        return None
    # each stuck rank waits for another stuck one (every action it waits for is in that rank's row, not
    # yet run): following them from the first comes back to a rank already met, the cycle's start
    chain: list[int] = []
    at: int | None = min(q for q in range(p) if pos[q] < len(orders[q]))
    while at is not None and at not in chain:
        chain.append(at)
        at = _source(p, at, orders[at][pos[at]][0])
    chain = chain[chain.index(at) :] if at is not None else chain
    words = {"F": "activation", "B": "gradient"}
    parts = []
    for k, q in enumerate(chain):
        kind, mb = orders[q][pos[q]]
        a = f"{kind}{mb}"
        src = _source(p, q, kind)
        head = f"rank {q}'s {a} waits" if k == 0 else f", which is waiting at {a}"
        parts.append(f"{head} for {a}'s {words[kind]} from rank {src}")
    first = chain[0]
    kind, mb = orders[first][pos[first]]
    last_kind, last_mb = orders[chain[-1]][pos[chain[-1]]]
    return (
        "".join(parts)
        + f" — and rank {first} runs {last_kind}{last_mb} only after its {kind}{mb}: a cycle, no rank "
        f"can move. A rank can run B_i only once every rank after it has, and F_i once every rank before "
        f"it has: 1F1B's rank r runs p − r forwards before its first backward (here "
        f"{', '.join(str(p - q) for q in range(p))}: p − r − 1 to fill the pipeline, then one forward and "
        "one backward in turn)."
    )


def check_table(table: Any) -> tuple[Schedule | None, str]:
    """The learner's table as a validated Schedule (its transfers placed), or None and what is wrong."""
    try:
        orders = parse(table)
    except TableError as e:
        return None, str(e)
    problems = coverage_problems(orders)
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        return None, "; ".join(problems[:4]) + more
    if (stuck := deadlock(orders)) is not None:
        return None, f"your table deadlocks: {stuck}"
    m = 1 + max(mb for order in orders for _, mb in order)
    p = len(orders)
    steps = [[(kind, r, mb) for kind, mb in order] for r, order in enumerate(orders)]
    schedule = schedule_from_orders("yours", p, m, 1, steps)
    errors = validate(schedule)
    if errors:  # the replay above should have caught it: say what the validator found
        return None, "its transfers, placed, fail the schedule rule: " + "; ".join(errors[:3])
    return schedule, ""


def forwards_before_backward(schedule: Schedule) -> list[int]:
    """Per rank, the forwards it runs before its first backward (1F1B's rank r: p − r)."""
    found = []
    for acts in schedule.actions:
        kinds = [a.kind for a in acts if a.kind in ("F", "B")]
        found.append(kinds.index("B") if "B" in kinds else len(kinds))
    return found


def reference_table(p: int, m: int) -> list[list[str]]:
    """1F1B at p and m as a table: the workbench's generator (schedules/build.py)."""
    from workbench.schedules.build import build_schedule

    s = build_schedule("1f1b", p, m)
    return [[f"{a.kind}{a.microbatch}" for a in acts if a.kind in ("F", "B")] for acts in s.actions]


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


#: runs kept for reuse: (config, folder) → the run and its summary.json's modification time
_REUSED: dict[str, tuple[Run, float]] = {}


def _launch(config: RunConfig, out: str, *, reuse: bool) -> Run:
    """A run of `config` into `out`; the reference and the one-process run depend on p and m only, so a
    later check in this Python process reuses them (`reuse`) while their folder holds that same run."""
    from workbench.launching.launcher import launch

    key = json.dumps([config.to_dict(), out], sort_keys=True, default=str)
    summary = os.path.join(out, "summary.json")
    if reuse and key in _REUSED and os.path.isfile(summary):
        run, written = _REUSED[key]
        if os.path.getmtime(summary) == written:
            return run
    run = launch(config, out=out, progress=False, force=True)
    if reuse:
        _REUSED[key] = (run, os.path.getmtime(summary))
    return run


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


def judge(runs: dict[str, Run], schedule: Schedule, *, held: bool = True) -> Result:
    """The learner's run against one process, the activations in flight (counted from the table on every
    rank, measured on rank 0) and the simulated bubble; `held=False` (try_schedule): the last three shown
    beside 1F1B's, not held."""
    yours, reference, single = runs["yours"], runs["reference"], runs["one process"]
    p, m = schedule.p, schedule.m
    counted, one_f_one_b = peak_in_flight(schedule), list(range(p, 0, -1))
    mine, one = yours.metrics, single.metrics
    loss = max(abs(a - b) / abs(b) for a, b in zip(mine.loss, one.loss, strict=True))
    norm = max(abs(a - b) / abs(b) for a, b in zip(mine.grad_norm, one.grad_norm, strict=True))
    held_0, peak, unit = activations_held(yours)
    bubble, formula = simulate(schedule, t_f=T_F, t_b=T_B).bubble_fraction(), (p - 1) / (m + p - 1)
    same = loss <= LOSS_RTOL and norm <= NORM_RTOL
    rows = [
        Row(
            what="loss vs one process, largest relative difference",
            yours=loss,
            target=f"≤ {LOSS_RTOL:g}",
            ok=loss <= LOSS_RTOL,
        ),
        Row(
            what="gradient norm vs one process, largest relative difference",
            yours=norm,
            target=f"≤ {NORM_RTOL:g}",
            ok=norm <= NORM_RTOL,
        ),
        Row(
            what="activations rank 0 holds at once, microbatches",
            yours=held_0,
            target=f"≤ p = {p} (1F1B's run: {activations_held(reference)[0]:.3g})",
            ok=held_0 <= p + HELD_SLACK if held else None,
            measured=True,
        ),
        Row(
            what="activations in flight on each rank, microbatches (counted from your table)",
            yours=counted,
            target=f"≤ 1F1B's p − r = {one_f_one_b}",
            ok=all(c <= t for c, t in zip(counted, one_f_one_b, strict=True)) if held else None,
        ),
        Row(
            what=f"bubble at equal stage costs (simulated, T_B = {T_B / T_F:g}·T_F)",
            yours=bubble,
            target=f"(p−1)/(m+p−1) = {formula:.4g}",
            ok=bubble <= formula + 1e-9 if held else None,
        ),
        Row(
            what="bubble fraction on this machine (shown, not held)",
            yours=yours.summary["bubble_fraction"]["measured"],
            target=reference.summary["bubble_fraction"]["measured"],
            ok=None,
            measured=True,
        ),
    ]

    def result(passed: bool, stage: str, message: str) -> Result:
        return Result(
            exercise="pipeline",
            passed=passed,
            stage=stage,
            message=message,
            rows=rows,
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
