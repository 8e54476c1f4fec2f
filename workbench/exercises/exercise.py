"""One graded exercise, as the catalogue lists it: what the learner writes, the task (signature, what the
arguments give, the target beyond a correct answer), the empty cell a notebook ships, and the grader."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.exercises.result import Result


@dataclass(frozen=True, kw_only=True)
class Exercise:
    name: str
    title: str
    #: one line: what the learner writes
    you_write: str
    #: what it is held to beyond a correct answer (bytes on the wire, bubble, peak memory, waste)
    target: str
    #: markdown: the signature, what the arguments give, the rules, the target
    task: str
    #: the cell a notebook ships for it: the signature and an empty body (or an empty table)
    stub: str
    #: grade(solution, out) → Result: validate, run on ranks, compare with one process and the target
    grade: Callable[[Any, str], Result]
