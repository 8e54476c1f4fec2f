"""The common path of an exercise whose answer is a function run on ranks (ring, buckets, zero1,
tensor-parallel): the function's source taken (what the ranks run), the exercise's own check in this process
(a simulation that names what is wrong, before any process starts) of the function loaded from that source —
the same function, with the same globals (torch and math only), that the ranks run, so that what passes here
does not fail there with a NameError — then the learner's and the reference's runs on real ranks, handed to
the exercise's judge (one process, the target)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from workbench.analysis.run import Run
from workbench.config import RunConfig
from workbench.exercises.ranks import failure_message, run_on_ranks
from workbench.exercises.result import Result
from workbench.exercises.submission import (
    GLOBALS_HINT,
    SolutionError,
    function_source,
    load,
    not_defined,
)
from workbench.launching.launcher import RunFailed


def at_sizes(
    fn: Any, *, sizes: tuple[int, ...], check: Callable[[Any, int], str | None], size_name: str
) -> str | None:
    """`check(fn, n)` on simulated ranks at each size in turn (the real run's first): the first wrong answer,
    said where it was found — at a later size, with the hint that a number stands where `size_name` should."""
    for n in sizes:
        wrong = check(fn, n)
        if wrong is not None:
            hint = (
                f" (it passed on {sizes[0]}: does it use {size_name}, not a number?)"
                if n != sizes[0]
                else ""
            )
            return f"on {n} simulated ranks{hint}, before any process started: {wrong}"
    return None


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
    """Validate (`function_source`, then `simulated(fn)` of the function loaded from that source as a rank
    loads it: what is wrong, said where it was found, or None), run yours and the reference on `config`'s
    gloo ranks into out/yours and out/reference (each rank's settings: {"label": "yours" | "reference"}),
    and return `judge(yours, reference)`; a failed stage's Result
    otherwise."""
    try:
        source = function_source(solution, function=function, params=params)
    except SolutionError as e:
        return Result(exercise=exercise, passed=False, stage="validate", message=str(e))
    try:
        fn = load(source)
    except Exception as e:  # the source as the ranks would load it: a decorator's NameError, say
        return Result(exercise=exercise, passed=False, stage="validate", message=not_defined(e))
    wrong = simulated(fn)
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
        message = failure_message(e)
        if "NameError:" in message or "NameError:" in e.traceback:
            message = f"{message}\n{GLOBALS_HINT}"
        return Result(exercise=exercise, passed=False, stage="run", message=message)
    return judge(runs["yours"], runs["reference"])
