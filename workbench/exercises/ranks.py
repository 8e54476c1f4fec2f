"""Running an exercise on real ranks: torchrun (launching/launcher.launch_module) starts
`workbench.exercises.on_rank` in each process of a gloo group, with the learner's source as the run's
solution.py (or none: the reference answer), the exercise's settings as exercise.json. Each rank writes its
trace (the ordinary run format: `viz.timeline` draws it) and exercise_rank{r}.json, what it found."""

from __future__ import annotations

import json
import os
from typing import Any

from workbench.analysis.run import Run
from workbench.config import RunConfig
from workbench.launching.launcher import RunFailed, launch_module

#: the reference runs launched in this process: (exercise, config, settings, folder) → its Run and when its
#: rank 0 wrote its result. The reference answer is deterministic code, so a second check of the same exercise
#: into the same folder (a learner's next try, the next test) shows the run already made — while the folder
#: still holds it (nothing has written there since) — instead of launching it again
_REFERENCES: dict[tuple[str, str, str, str], tuple[Run, float]] = {}

#: a rank that waits longer than this on a collective ends the run, naming itself and the operation: an
#: exercise is seconds of work, and a learner's deadlock should say so quickly
EXERCISE_TIMEOUT_S = 20.0


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
    key = (exercise, config.to_json(), json.dumps(settings, sort_keys=True), os.path.abspath(out))
    written = os.path.join(out, "exercise_rank0.json")
    if solution is None and key in _REFERENCES and os.path.isfile(written):
        run, when = _REFERENCES[key]
        if os.path.getmtime(written) == when:
            return run
    files = {"exercise.json": json.dumps({"exercise": exercise, "settings": settings})}
    if solution is not None:
        files["solution.py"] = solution
    run = launch_module(
        config.validate(), "workbench.exercises.on_rank", files=files, out=out, force=True
    )
    if solution is None:
        _REFERENCES[key] = (run, os.path.getmtime(written))
    return run


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
