"""Graded exercises on the real engine (`wb.exercises`): the learner writes a mechanism — one rank's ring
all-reduce, the bucketed data-parallel hook, the ZeRO-1 step, a tensor-parallel MLP with f and g, 1F1B for four
stages as a table, Young/Daly's checkpoint interval — and `check(name, solution)` grades it:

1. **validate** before any process starts: the shapes and signature, and where it can be decided without
   running ranks, the schedule rule and deadlock freedom (an in-process simulation names the rank and step);
2. **run** it on real gloo ranks, traced like training (`exercises/on_rank.py`);
3. compare it with **one process** (the reduced tensor, the losses, the gradients);
4. hold it to a **target** (bytes on the wire, bubble, peak memory, waste), measured;

and shows the learner's timeline beside the reference's. A wrong answer gets a message that teaches (the rank
and step where it deadlocks, the bucket reduced twice, the off-by-one in the ring, the missing g). The reference
answers live in `exercises/answers.py`, which the notebook never prints.

    import workbench as wb
    wb.exercises.show("ring")              # the task
    wb.exercises.check("ring", my_ring)    # a Result: shows itself in a notebook
    wb.exercises.try_schedule(my_table)    # a pipeline schedule of your own, beside 1F1B
"""

from __future__ import annotations

import os

import pandas as pd

from workbench.exercises.catalogue import EXERCISES
from workbench.exercises.exercise import Exercise
from workbench.exercises.pipeline import try_schedule
from workbench.exercises.result import ExerciseFailed, Result, Row

#: where a check's runs go unless told: <out>/<exercise>/yours and …/reference
DEFAULT_OUT = os.path.join("traces", "exercises")

__all__ = [
    "EXERCISES",
    "Exercise",
    "ExerciseFailed",
    "Result",
    "Row",
    "check",
    "show",
    "table",
    "try_schedule",
]


def exercise(name: str) -> Exercise:
    if name not in EXERCISES:
        raise KeyError(f"exercise {name!r}: valid are {sorted(EXERCISES)}")
    return EXERCISES[name]


def table() -> pd.DataFrame:
    """The exercises: what you write and what it is held to."""
    return pd.DataFrame(
        [
            {"exercise": e.name, "title": e.title, "you write": e.you_write, "target": e.target}
            for e in EXERCISES.values()
        ]
    )


def show(name: str) -> None:
    """The task (markdown in a notebook, text elsewhere)."""
    text = f"### {exercise(name).title}\n\n{exercise(name).task}"
    try:
        from IPython import get_ipython

        if get_ipython() is not None:
            from IPython.display import Markdown, display

            display(Markdown(text))
            return
    except ModuleNotFoundError:
        pass
    print(text)


def check(name: str, solution: object, *, out: str | None = None) -> Result:
    """Grade `solution` for exercise `name`: validate, run on real ranks beside the reference, compare with
    one process and the target (see the module's docstring). Its runs go to `out` (default
    traces/exercises/<name>/)."""
    return exercise(name).grade(solution, os.path.abspath(out or os.path.join(DEFAULT_OUT, name)))
