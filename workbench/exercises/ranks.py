"""Running an exercise on real ranks: torchrun (launching/launcher.launch_module) starts
`workbench.exercises.on_rank` in each process of a gloo group, with the learner's source as the run's
solution.py (or none: the reference answer), the exercise's settings as exercise.json. Each rank writes its
trace (the ordinary run format: `viz.timeline` draws it) and exercise_rank{r}.json, what it found."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from workbench.analysis.run import Run
from workbench.config import RunConfig
from workbench.launching.launcher import RunFailed, launch_module

#: runs kept for reuse in this process: key → the run and when the file that marks it was written
_REUSED: dict[str, tuple[Run, float]] = {}

#: a rank that waits longer than this on a collective ends the run, naming itself and the operation: an
#: exercise is seconds of work, and a learner's deadlock should say so quickly
EXERCISE_TIMEOUT_S = 20.0


def reused(key: str, marker: str, launch: Callable[[], Run]) -> Run:
    """The run launched for `key` earlier in this process, while `marker` (a file that run wrote in its folder)
    is unchanged — nothing has written there since —, else `launch()`, kept for next time. A reference answer,
    a one-process run: deterministic, so a learner's next try (or the next test) shows the run already made."""
    if key in _REUSED and os.path.isfile(marker):
        run, written = _REUSED[key]
        if os.path.getmtime(marker) == written:
            return run
    run = launch()
    _REUSED[key] = (run, os.path.getmtime(marker))
    return run


def run_on_ranks(
    exercise: str,
    *,
    config: RunConfig,
    solution: str | None,
    settings: dict[str, Any],
    out: str,
) -> Run:
    """Launch the exercise (config: its grid, on gloo; `solution`: the learner's source, None for the
    reference — launched once per process, settings and folder, its Run reused after) into `out` (replaced); the
    loaded Run, or RunFailed naming the rank that failed."""
    config = config.replace(backend="gloo", timeout_s=EXERCISE_TIMEOUT_S, name=exercise)
    files = {"exercise.json": json.dumps({"exercise": exercise, "settings": settings})}
    if solution is not None:
        files["solution.py"] = solution

    def launch() -> Run:
        return launch_module(
            config.validate(), "workbench.exercises.on_rank", files=files, out=out, force=True
        )

    if solution is not None:
        return launch()
    key = json.dumps([exercise, config.to_json(), settings, os.path.abspath(out)], sort_keys=True)
    return reused(key, os.path.join(out, "exercise_rank0.json"), launch)


def rank_results(run: Run) -> list[dict[str, Any]]:
    """What each rank's exercise side returned (exercise_rank{r}.json), in rank order."""
    world = RunConfig.from_dict(run.config).world_size
    found = []
    for r in range(world):
        with open(os.path.join(run.path, f"exercise_rank{r}.json")) as f:
            found.append(json.load(f))
    return found


def failure_message(failed: RunFailed) -> str:
    """A failed launch in a learner's words: the rank, the error, and the lines of their solution in its
    traceback (the rest of the traceback is the workbench's)."""
    lines = failed.traceback.splitlines()
    yours = [
        f"{line.strip()}  →  {lines[i + 1].strip() if i + 1 < len(lines) else ''}"
        for i, line in enumerate(lines)
        if "solution.py" in line
    ]
    head = str(failed).split("\n(run directory kept")[0]
    where = ("\nin your solution: " + "; ".join(yours)) if yours else ""
    return f"{head}{where}"
