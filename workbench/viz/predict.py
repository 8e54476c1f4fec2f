"""Predict, then run: the learner types a number before the run, and the run then says how far off it was.

    guess = viz.predict("What share of the step will 1F1B's bubble take at p = 4, m = 8?", unit="%")
    ...                                       # the run
    guess.reveal(measured_percent, "Why: ...") # the answer, folded, and the learner's error, live

`predict` shows a text box (ipywidgets) under the question. `reveal` shows the measured answer inside a fold
(an HTML `<details>`, closed: it opens in Jupyter and on the documentation site alike) and, beside it, a line
that follows what the learner typed: "you said 20 %, measured 18 %: 11 % too high". The line updates as the
learner types, so a notebook run from top to bottom (Run All) still asks first: the answer stays folded.
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
        self.box = widgets.Text(placeholder="your prediction (a number)", description="predict:",
                                layout={"width": "40%"})

    @property
    def value(self) -> float | None:
        return _number(self.box.value)

    def _ipython_display_(self) -> None:
        display(HTML(f"<p><b>Predict first.</b> {html.escape(self.question)}</p>"), self.box)

    def verdict(self, measured: float) -> str:
        """What the learner is told against `measured`."""
        guess = self.value
        if guess is None:
            return "Type your prediction in the box above; this line then says how far off it was."
        return (f"You said {guess:.4g}{self.unit}; measured {measured:.4g}{self.unit}: "
                f"{how_far_off(guess, measured)}.")

    def reveal(self, measured: float, why: str = "") -> None:
        """The measured answer in a closed fold, and the learner's error, following the box as it changes."""
        line = widgets.HTML(f"<p>{html.escape(self.verdict(measured))}</p>")
        self.box.observe(lambda _: setattr(line, "value", f"<p>{html.escape(self.verdict(measured))}</p>"),
                         names="value")
        answer = f"measured: <b>{measured:.4g}{html.escape(self.unit)}</b>" + (f". {html.escape(why)}" if why else "")
        display(line, HTML(f"<details><summary>The answer (open it after you predict)</summary><p>{answer}</p>"
                           f"</details>"))


def predict(question: str, unit: str = "") -> Prediction:
    """Ask `question` with a box for the learner's number (shown when it is a cell's last expression)."""
    return Prediction(question, unit)
