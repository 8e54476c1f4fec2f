"""The common path of an exercise whose answer is a function run on ranks (ring, buckets, zero1,
tensor-parallel): the function's source taken (what the ranks run), the exercise's own check in this process
(a simulation that names what is wrong, before any process starts), then the learner's and the reference's runs
on real ranks, handed to the exercise's judge (one process, the target)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from workbench.analysis.run import Run
from workbench.config import RunConfig
from workbench.exercises.ranks import failure_message, run_on_ranks
from workbench.exercises.result import Result
from workbench.exercises.submission import SolutionError, function_source
from workbench.launching.launcher import RunFailed


def grade_function(
    exercise: str,
    solution: Any,
    *,
    function: str,
    params: tuple[str, ...],
    simulated: Callable[[Any], str | None],
    config: RunConfig,
    judge: Callable[[Run, Run], Result],
    out: str,
) -> Result:
    """Validate (`function_source`, then `simulated(solution)`: what is wrong, said where it was found, or
    None), run yours and the reference on `config`'s gloo ranks into out/yours and out/reference (each rank's
    settings: {"label": "yours" | "reference"}), and return `judge(yours, reference)`; a failed stage's Result
    otherwise."""
    try:
        source = function_source(solution, exercise=function, params=params)
    except SolutionError as e:
        return Result(exercise=exercise, passed=False, stage="validate", message=str(e))
    wrong = simulated(solution)
    if wrong is not None:
        return Result(exercise=exercise, passed=False, stage="validate", message=wrong)
    try:
        runs = {
            label: run_on_ranks(
                exercise,
                config=config,
                solution=source if label == "yours" else None,
                settings={"label": label},
                out=os.path.join(out, label),
            )
            for label in ("yours", "reference")
        }
    except RunFailed as e:
        return Result(exercise=exercise, passed=False, stage="run", message=failure_message(e))
    return judge(runs["yours"], runs["reference"])
