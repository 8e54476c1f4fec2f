"""Predict, then run: the learner types a number before the run, and the run then says how far off it was.

    guess = viz.predict("What share of the step will 1F1B's bubble take at p = 4, m = 8?", unit="%")
    ...                                       # the run
    guess.reveal(measured_percent, "Why: ...") # the answer, folded, and the learner's error, live

`predict` shows a text box (ipywidgets) under the question. The learner types a number, then runs on: `reveal`
reads the box and says how far off it was ("You said 20 %; measured 18 %: 11 % too high"), with the measured
answer inside a fold (an HTML `<details>`, closed: it opens in Jupyter and on the documentation site alike). A
notebook run from top to bottom (Run All) still asks first: the answer stays folded, and the line asks for a
number and for the cell to be run again.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets
from IPython.display import HTML, display


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", "").replace("%", "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def how_far_off(guess: float, measured: float) -> str:
    """'11 % too high', 'exact', or for a measured 0 the difference itself."""
    if guess == measured:
        return "exact"
    if measured == 0:
        return f"{guess:+.3g} off"
    share = (guess - measured) / abs(measured)
    return f"{abs(share):.0%} too {'high' if share > 0 else 'low'}"


class Prediction:
    """A question with the learner's typed answer; `reveal` compares it with the measurement."""

    def __init__(self, question: str, unit: str = "") -> None:
        self.question, self.unit = question, unit
        self.box = widgets.Text(
            placeholder="your prediction (a number)",
            description="predict:",
            layout={"width": "40%"},
        )

    @property
    def value(self) -> float | None:
        return _number(self.box.value)

    def _ipython_display_(self) -> None:
        display(HTML(f"<p><b>Predict first.</b> {html.escape(self.question)}</p>"), self.box)

    def verdict(self, measured: float, *, label: str = "measured") -> str:
        """What the learner is told against `measured` (`label`: how the answer was found)."""
        guess = self.value
        if guess is None:
            return (
                "Type your prediction in the box above, then run this cell again: it says how far off you "
                "were."
            )
        return (
            f"You said {guess:.4g}{self.unit}; {label} {measured:.4g}{self.unit}: "
            f"{how_far_off(guess, measured)}."
        )

    def reveal(self, measured: float, why: str = "", *, label: str = "measured") -> None:
        """The learner's error against `measured` (from what the box holds when this runs), and the measured
        answer in a closed fold. `label` says how the answer was found where it is not read off a clock, the
        allocator or the bytes (e.g. "counted at the measured peak"). Plain HTML, no widget: a reopened
        notebook shows it as it was, and JupyterLab restores one widget fewer (each restore races its 2 s
        wait for the model on a busy machine)."""
        answer = f"{html.escape(label)}: <b>{measured:.4g}{html.escape(self.unit)}</b>" + (
            f". {html.escape(why)}" if why else ""
        )
        verdict = html.escape(self.verdict(measured, label=label))
        display(
            HTML(
                f"<p>{verdict}</p><details><summary>The answer (open it after you predict)</summary>"
                f"<p>{answer}</p></details>"
            )
        )


def predict(question: str, unit: str = "") -> Prediction:
    """Ask `question` with a box for the learner's number (shown when it is a cell's last expression)."""
    return Prediction(question, unit)
