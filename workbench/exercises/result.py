"""What a check says: passed or not, at which stage (validate, run, one process, target), the message that
teaches, the measured figures beside their targets, and the learner's run beside the reference's.

In a notebook a Result shows itself (a verdict line, the table, the two timelines). Under test
(WORKBENCH_CHECKS=raise, as for viz.check) showing a failed Result raises ExerciseFailed, so that a notebook
whose filled-in answers stop passing fails its test; `check()` itself never raises for a wrong answer."""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from workbench.analysis.run import Run

#: the stages a check goes through, in order; a failed Result names the one it stopped at
STAGES = ("validate", "run", "one process", "target")


class ExerciseFailed(AssertionError):
    """A failed check shown under test (WORKBENCH_CHECKS=raise)."""


@dataclass(kw_only=True)
class Row:
    """One figure of the check: the learner's, the target's, and whether it meets it. `measured`: from the
    clock, the allocator or the bytes on the wire (else it is counted from the solution itself)."""

    what: str
    yours: Any
    target: Any
    ok: bool | None
    measured: bool = False


@dataclass(kw_only=True)
class Result:
    exercise: str
    passed: bool
    #: where it stopped (STAGES), or "passed"
    stage: str
    message: str
    rows: list[Row] = field(default_factory=list)
    learner: Run | None = None
    reference: Run | None = None
    #: an exercise's own chart (its default: the two timelines)
    chart: go.Figure | None = None

    def __str__(self) -> str:
        head = f"{'✓' if self.passed else '✗'} {self.exercise}: {self.message}"
        lines = [
            f"  {r.what}: yours {_fmt(r.yours)}, target {_fmt(r.target)}"
            + ("" if r.ok is None else (" ✓" if r.ok else " ✗"))
            for r in self.rows
        ]
        return "\n".join([head, *lines])

    __repr__ = __str__

    def table_html(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(r.what)}{' (measured)' if r.measured else ''}</td>"
            f"<td>{html.escape(_fmt(r.yours))}</td><td>{html.escape(_fmt(r.target))}</td>"
            f"<td>{'' if r.ok is None else ('✓' if r.ok else '✗')}</td></tr>"
            for r in self.rows
        )
        return (
            f"<table><tr><th>figure</th><th>yours</th><th>target</th><th></th></tr>{rows}</table>"
            if rows
            else ""
        )

    def row(self, what: str) -> Row:
        """The row whose figure's name starts with `what` (KeyError naming those there are)."""
        for r in self.rows:
            if r.what.startswith(what):
                return r
        raise KeyError(
            f"no row {what!r} in {self.exercise}'s result: {[r.what for r in self.rows]}"
        )

    def figure(self) -> go.Figure | None:
        """The exercise's chart, else the learner's timeline beside the reference's (when both ran)."""
        if self.chart is not None:
            return self.chart
        if self.learner is None or self.reference is None:
            return None
        from workbench.exercises.side_by_side import side_by_side

        return side_by_side(self.learner, self.reference, title=self.exercise)

    def _repr_html_(self) -> str:
        mark, colour = ("✓", "#1a7f37") if self.passed else ("✗", "#cf222e")
        where = "" if self.passed else f" <i>(stopped at: {self.stage})</i>"
        message = html.escape(self.message).replace("\n", "<br>")
        return (
            f"<div class='exercise-result'><p style='color:{colour}'><b>{mark} {self.exercise}</b>{where}: "
            f"{message}</p>{self.table_html()}</div>"
        )

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        display(HTML(self._repr_html_()))
        fig = self.figure()
        if fig is not None:
            display(fig)
        if not self.passed and os.environ.get("WORKBENCH_CHECKS") == "raise":
            raise ExerciseFailed(str(self))


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
