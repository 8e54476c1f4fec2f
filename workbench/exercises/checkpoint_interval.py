"""Exercise `checkpoint-interval`: how often to checkpoint (Young 1974; Daly 2006), from a checkpoint cost measured
on a real run and a failure rate.

The learner writes `checkpoint_interval(checkpoint_s, failures_per_node_day, nodes)` → the seconds between
checkpoints that lose the least time. A job stops when any of its nodes fails, so its mean time between failures is
M = 1 day / (failures per node-day × nodes); checkpointing every τ seconds loses δ/τ (writing) + τ/(2M) (half an
interval redone per failure) of the time — predict/formulas/faults.checkpoint_overhead, the curve notebook 08 draws —,
least at Young's τ = √(2δM). Daly's √(2δM) − δ is accepted too. Graded in two stages:

- **validate**, in this process before anything starts: the function at five modelled settings (δ of 10–300 s, the
  cost of a large model's checkpoint; 128–2048 nodes; 0.005–0.1 failures per node-day) must return a positive
  finite number of seconds whose waste is within TOLERANCE of the least. A wrong answer is named by its shape: the
  nodes forgotten (the intervals grow as √nodes), the 2 missing (1/√2 of Young's), no square root, hours, minutes
  or days in place of seconds (a constant ratio: 1/60, 1/3600, 1/√86400 …);
- **run**: a real run (the tiny model, dp = 2, a checkpoint after every step: `torch.distributed.checkpoint`)
  measures δ with the clock — the checkpoint spans of its trace —, and the function must hold the same target at
  that measured cost, three failure settings. A cheap checkpoint wants an interval of seconds: an answer rounded to
  whole minutes passes at the modelled costs and fails here.

The least waste is found by searching τ (golden section on the waste, not by Young's formula), so the check could
catch a formula that is not the optimum. TOLERANCE, 1 %: the waste is flat near its least — an interval k times the
best wastes (k + 1/k)/2 times the least, so 1 % accepts k in [0.87, 1.15] (Daly's −δ costs < 0.4 % at these settings,
where δ ≤ M/70 and the first-order model holds) and rejects the missing 2 (k = 0.71: +6 %) and everything worse.
The waste is modelled (first order, failures at a constant rate); the checkpoint cost is the one figure measured.
"""

from __future__ import annotations

import math
import numbers
import os
import statistics
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.exercises.checkpoint_interval_chart import interval_chart
from workbench.exercises.exercise import Exercise
from workbench.exercises.result import Result, Row
from workbench.exercises.simulated_ranks import raised
from workbench.exercises.submission import SolutionError, function_source, load, not_defined
from workbench.predict.formulas.faults import checkpoint_overhead

if TYPE_CHECKING:
    from workbench.analysis.run import Run

NAME = "checkpoint-interval"
#: the file name tracebacks give the learner's function
SOURCE_NAME = "<your solution>"
PARAMS = ("checkpoint_s", "failures_per_node_day", "nodes")
SECONDS_PER_DAY = 86_400.0
#: the learner's waste may exceed the least by this fraction (see the module's docstring)
TOLERANCE = 0.01
#: how long the learner's function may take at one setting (it is a formula: microseconds) before the check
#: calls it a loop that does not end
CALL_DEADLINE_S = 3.0
#: a checkpoint after every one of these steps; the first save also imports torch.distributed.checkpoint
#: (0.4 s and more, once per process), so δ is the median of the others
MEASURED_STEPS = 5


@dataclass(frozen=True, kw_only=True)
class Setting:
    checkpoint_s: float
    failures_per_node_day: float
    nodes: int
    measured: bool = False

    @property
    def mtbf_s(self) -> float:
        """The job's mean time between failures: it stops when any of its nodes fails."""
        return SECONDS_PER_DAY / (self.failures_per_node_day * self.nodes)

    @property
    def young_s(self) -> float:
        return math.sqrt(2 * self.checkpoint_s * self.mtbf_s)

    def describe(self) -> str:
        cost = (
            f"δ = {self.checkpoint_s * 1e3:.1f} ms (measured)"
            if self.measured
            else f"δ = {self.checkpoint_s:g} s"
        )
        return (
            f"{cost}, {self.failures_per_node_day:g} failures per node-day, {self.nodes} nodes "
            f"(job MTBF {self.mtbf_s:.0f} s)"
        )


#: large models' checkpoint costs on jobs of 128–2048 nodes, each with δ ≤ M/70 (first order holds)
MODELLED = (
    Setting(checkpoint_s=30.0, failures_per_node_day=0.01, nodes=1024),
    Setting(checkpoint_s=300.0, failures_per_node_day=0.01, nodes=128),
    Setting(checkpoint_s=60.0, failures_per_node_day=0.02, nodes=256),
    Setting(checkpoint_s=10.0, failures_per_node_day=0.1, nodes=1024),
    Setting(checkpoint_s=120.0, failures_per_node_day=0.005, nodes=2048),
)
MODELLED_COSTS = (
    f"{min(s.checkpoint_s for s in MODELLED):g}–{max(s.checkpoint_s for s in MODELLED):g} s"
)
#: (failures per node-day, nodes) at the measured cost
AT_MEASURED = ((0.01, 1024), (0.1, 1024), (0.03, 4096))


def least_waste(setting: Setting) -> tuple[float, float]:
    """(τ, waste) where checkpoint_overhead is least, by golden-section search on log τ (δ/100 … 100 M)."""

    def waste(log_tau: float) -> float:
        return checkpoint_overhead(math.exp(log_tau), setting.checkpoint_s, setting.mtbf_s)

    lo, hi = math.log(setting.checkpoint_s / 100), math.log(100 * setting.mtbf_s)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(120):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        lo, hi = (lo, b) if waste(a) < waste(b) else (a, hi)
    return math.exp((lo + hi) / 2), waste((lo + hi) / 2)


@dataclass(frozen=True, kw_only=True)
class Found:
    """The learner's interval at one setting beside the least waste."""

    setting: Setting
    yours_s: float
    best_s: float
    least: float

    @property
    def waste(self) -> float:
        return checkpoint_overhead(self.yours_s, self.setting.checkpoint_s, self.setting.mtbf_s)

    @property
    def ok(self) -> bool:
        return self.waste <= (1 + TOLERANCE) * self.least


def evaluate(source: str, settings: tuple[Setting, ...]) -> list[Found] | str:
    """The learner's interval at each setting (their function loaded from `source`, with torch and math as its
    globals, as on the ranks of the other exercises), or what is wrong with what it returned (a message)."""
    try:
        fn = load(source, filename=SOURCE_NAME)
    except Exception as e:  # a default argument naming what is not there, say
        return not_defined(e)
    found = []
    for s in settings:
        try:
            value = call_with_deadline(fn, s)
        except NoReturn as e:
            return f"at {s.describe()} {e}"
        except Exception as e:  # the learner's error, kept for the message
            return f"at {s.describe()} your function raised {raised(e, fn)}"
        number = _as_number(value)
        if number is None or not math.isfinite(number) or number <= 0:
            return (
                f"at {s.describe()} your function returned {value!r}: it must return the interval as a "
                "positive number of seconds (checkpointing every τ seconds, 0 < τ < ∞)"
            )
        best, least = least_waste(s)
        found.append(Found(setting=s, yours_s=number, best_s=best, least=least))
    return found


class NoReturn(Exception):
    """The learner's function did not return within CALL_DEADLINE_S."""


def call_with_deadline(fn: Any, s: Setting) -> Any:
    """fn at setting `s`, on a daemon thread given CALL_DEADLINE_S: its value, what it raised, or NoReturn
    (the thread cannot be stopped: it runs on, and the message says so)."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn(s.checkpoint_s, s.failures_per_node_day, s.nodes)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=CALL_DEADLINE_S)
    if thread.is_alive():
        raise NoReturn(
            f"your function did not return within {CALL_DEADLINE_S:g} s: a loop that does not end? (it still "
            "runs in this kernel; restart the kernel)"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "numel", lambda: 0)() == 1:  # a one-element tensor
        return float(value)
    return None


def _forgot(s: Setting) -> float:
    return math.sqrt(2 * s.checkpoint_s * SECONDS_PER_DAY / s.failures_per_node_day)


def _times_nodes(s: Setting) -> float:
    return math.sqrt(2 * s.checkpoint_s * SECONDS_PER_DAY * s.nodes / s.failures_per_node_day)


#: wrong formulas a learner writes, and why each is wrong (formatted with the first setting's figures)
SHAPES = (
    (
        _forgot,
        "Your intervals are Young's with one node's MTBF ({node_mtbf:.0f} s, {node_days:g} days): "
        "√{nodes} = {sqrt_nodes:.0f} times too long at {nodes} nodes. The job stops when any of its {nodes} "
        "nodes fails: its MTBF is the node's divided by {nodes}, "
        "M = 1 day / (failures per node-day × nodes) = {mtbf:.0f} s",
    ),
    (
        _times_nodes,
        "Your MTBF grows with the nodes ({nodes} nodes: {nodes} × the node's): more nodes fail more often, so the "
        "job's MTBF is the node's divided by the nodes, M = 1 day / (failures per node-day × nodes) = {mtbf:.0f} s",
    ),
    (
        lambda s: 2 * s.checkpoint_s * s.mtbf_s,
        "Your interval is 2δM, with no square root. The waste δ/τ + τ/(2M) is least where its two terms are "
        "equal, δ/τ = τ/(2M): τ² = 2δM, τ = √(2δM) ({young:.0f} s here, not {yours:.0f})",
    ),
    (
        lambda s: s.checkpoint_s * s.mtbf_s,
        "Your interval is δM, with no square root and no 2. The waste δ/τ + τ/(2M) is least where its two "
        "terms are equal: τ² = 2δM, τ = √(2δM) ({young:.0f} s here, not {yours:.0f})",
    ),
)
#: constant ratios to Young's (or Daly's) interval, and what each says
RATIOS = (
    (
        1 / math.sqrt(2),
        "the 2 is missing: after a failure the work since the last checkpoint is redone, on average half an "
        "interval, τ/2, once every M seconds: the waste is δ/τ + τ/(2M), least at τ = √(2δM)",
    ),
    (
        math.sqrt(2),
        "the 2 belongs under the square root: τ = √(2δM), not 2√(δM)",
    ),
    (
        1 / 60,
        "a unit: your intervals are in minutes, or M went under the square root in hours (√3600 = 60). δ comes "
        "in seconds, so M must be in seconds too (1 day = 86 400 s), and the interval is returned in seconds",
    ),
    (
        1 / 3600,
        "a unit: your intervals are in hours. Return seconds: δ is in seconds and M = 86 400 s / (failures per "
        "node-day × nodes)",
    ),
    (
        1 / math.sqrt(SECONDS_PER_DAY),
        "a unit: M in days (1 / (failures per node-day × nodes)) under the root beside δ in seconds. A day is "
        "86 400 s: M = 86 400 / (failures per node-day × nodes) seconds",
    ),
    (
        1 / math.sqrt(24),
        "a unit: a day is 86 400 s, not 3600 (an hour): M = 86 400 / (failures per node-day × nodes) seconds",
    ),
    (60.0, "a unit converted once too often: the interval is in seconds already, as δ and M are"),
    (3600.0, "a unit converted once too often: the interval is in seconds already, as δ and M are"),
)


def _matches(found: list[Found], wanted: Any) -> bool:
    """Whether every interval is `wanted(setting)`, or that minus δ (Daly's form), within 2 %."""
    for daly in (0, 1):
        formula = [wanted(f.setting) - daly * f.setting.checkpoint_s for f in found]
        if all(
            w > 0 and abs(f.yours_s / w - 1) < 0.02 for f, w in zip(found, formula, strict=True)
        ):
            return True
    return False


def diagnose(found: list[Found]) -> str | None:
    """What is wrong, in a learner's words; None when every interval wastes within TOLERANCE of the least."""
    bad = [f for f in found if not f.ok]
    if not bad:
        return None
    f = bad[0]
    s = f.setting
    figures = {
        "nodes": s.nodes,
        "sqrt_nodes": math.sqrt(s.nodes),
        "node_mtbf": SECONDS_PER_DAY / s.failures_per_node_day,
        "node_days": 1 / s.failures_per_node_day,
        "mtbf": s.mtbf_s,
        "young": s.young_s,
        "yours": f.yours_s,
    }
    beyond = (
        " (over 100 %: the first-order model δ/τ + τ/(2M) no longer holds once τ nears M — it says only that "
        "the interval is far too long)"
        if f.waste > 1
        else ""
    )
    where = (
        f"at {s.describe()} your interval is {f.yours_s:.4g} s and loses {100 * f.waste:.3g} % of the time"
        f"{beyond}; the least, {100 * f.least:.3g} %, is at {f.best_s:.4g} s."
    )
    for shape, why in SHAPES:
        if _matches(found, shape):
            return f"{where} {why.format(**figures)}"
    for ratio, why in RATIOS:
        if _matches(found, lambda s, r=ratio: r * s.young_s):
            return f"{where} Your intervals are {ratio:.4g} × Young's at every setting: {why}"
    return (
        f"{where} Young's interval is √(2δM), δ the checkpoint's cost in seconds and M the job's MTBF, "
        "1 day / (failures per node-day × nodes)."
    )


def measure_checkpoint(out: str) -> tuple[Run, list[float]]:
    """A real run that saves a checkpoint after each step: the run and each save's seconds, in step order — one
    save's: its slowest rank's span (the checkpoint counts when every rank's part is written)."""
    import workbench as wb

    config = wb.RunConfig(
        model="tiny",
        dp=2,
        global_batch=4,
        steps=MEASURED_STEPS,
        checkpoint_every=1,
        seed=0,
        backend="gloo",
    )
    run = wb.launch(config, out=os.path.join(out, "measured"), force=True, progress=False)
    ev = run.events
    saves = ev[(ev.cat == "checkpoint") & ev.name.str.startswith("checkpoint save")]
    return run, [us / 1e6 for us in saves.groupby("step")["dur_us"].max().sort_index()]


def checkpoint_cost(per_save_s: list[float]) -> float:
    """δ: the median save after the first (which also imports torch.distributed.checkpoint, once)."""
    return statistics.median(per_save_s[1:])


def grade(solution: Any, out: str) -> Result:
    """Validate at the modelled settings, measure δ on a real run, hold the waste at it."""
    from workbench.launching.launcher import RunFailed

    try:
        source = function_source(solution, function="checkpoint_interval", params=PARAMS)
    except SolutionError as e:
        return Result(exercise=NAME, passed=False, stage="validate", message=str(e))
    found = evaluate(source, MODELLED)
    wrong = found if isinstance(found, str) else diagnose(found)
    if wrong is not None:
        return Result(
            exercise=NAME,
            passed=False,
            stage="validate",
            message=f"modelled, before any process started — {wrong}",
        )
    try:
        run, per_save_s = measure_checkpoint(out)
    except RunFailed as e:
        return Result(
            exercise=NAME, passed=False, stage="run", message=f"the run measuring δ failed: {e}"
        )
    measured = tuple(
        Setting(
            checkpoint_s=checkpoint_cost(per_save_s),
            failures_per_node_day=rate,
            nodes=n,
            measured=True,
        )
        for rate, n in AT_MEASURED
    )
    at_measured = evaluate(source, measured)
    if isinstance(at_measured, str):
        return Result(
            exercise=NAME,
            passed=False,
            stage="target",
            message=f"{at_measured} (the modelled settings passed)",
            reference=run,
        )
    return judge(at_measured, run=run, per_save_s=per_save_s)


def judge(found: list[Found], *, run: Run, per_save_s: list[float]) -> Result:
    """The learner's intervals at the measured cost against the least waste, with the chart."""
    delta = found[0].setting.checkpoint_s
    rows = [
        Row(
            what=f"checkpoint cost δ, ms (median of {len(per_save_s) - 1} saves, slowest rank; shown, not held)",
            yours=delta * 1e3,
            target="—",
            ok=None,
            measured=True,
        )
    ]
    for f in found:
        s = f.setting
        rows.append(
            Row(
                what=f"interval, s: {s.failures_per_node_day:g}/node-day × {s.nodes} nodes",
                yours=f.yours_s,
                target=f.best_s,
                ok=None,
            )
        )
        rows.append(
            Row(
                what=f"time lost there, % (modelled), ≤ {1 + TOLERANCE:g} × the least",
                yours=100 * f.waste,
                target=100 * f.least,
                ok=f.ok,
            )
        )
    worst_first = sorted(found, key=lambda f: f.least / f.waste)
    wrong = diagnose(worst_first)
    chart = interval_chart(worst_first[0], per_save_s=per_save_s)
    if wrong is not None:
        message = (
            f"your intervals held at the modelled costs ({MODELLED_COSTS}) but not at the cost measured here: "
            f"{wrong} "
            "A cheap checkpoint is best taken often: τ = √(2δM) shrinks with δ."
        )
        return Result(
            exercise=NAME,
            passed=False,
            stage="target",
            message=message,
            rows=rows,
            reference=run,
            chart=chart,
        )
    message = (
        f"at every setting your interval loses within {100 * TOLERANCE:g} % of the least time: at the measured "
        f"δ = {delta * 1e3:.1f} ms and {found[0].setting.nodes} nodes, checkpoint every {found[0].yours_s:.3g} s "
        f"and lose {100 * found[0].waste:.2f} % of the time (modelled)"
    )
    return Result(
        exercise=NAME,
        passed=True,
        stage="passed",
        message=message,
        rows=rows,
        reference=run,
        chart=chart,
    )


EXERCISE = Exercise(
    name=NAME,
    title="Checkpoint interval: Young/Daly from a measured cost",
    you_write="checkpoint_interval(checkpoint_s, failures_per_node_day, nodes): seconds between checkpoints",
    target=f"time lost (modelled) ≤ {1 + TOLERANCE:g} × the least, also at the measured checkpoint cost",
    task=(
        "Write the checkpoint interval, in seconds, that loses the least time. `checkpoint_s` is δ, the seconds "
        "one checkpoint takes to write; each of the job's `nodes` nodes fails `failures_per_node_day` times a "
        "day on average, and the job stops when any of them does. Checkpointing every τ seconds loses δ/τ of "
        "the time writing and, per failure, the work since the last checkpoint (half an interval on average).\n\n"
        "```python\ndef checkpoint_interval(checkpoint_s, failures_per_node_day, nodes):\n    ...\n```\n\n"
        f"It is checked first at five modelled settings (δ of {MODELLED_COSTS}, 128–2048 nodes, 0.005–0.1 "
        "failures per node-day; a wrong answer is named there), then at the cost a real run measures here "
        "(the tiny model on two ranks, a checkpoint after each step; its checkpoint spans give δ) and three "
        "failure rates, the rows of the result's table. Target: the time lost at your interval "
        f"(δ/τ + τ/(2M), M the job's mean time between failures; modelled) within {100 * TOLERANCE:g} % of the "
        "least, at every setting. Your function runs with `math` and `torch` as its only globals."
    ),
    stub=(
        "def checkpoint_interval(checkpoint_s, failures_per_node_day, nodes):\n"
        "    # your code: the interval in seconds that wastes the least\n"
        "    ...\n"
    ),
    grade=grade,
)
