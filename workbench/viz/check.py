"""`check(claim, ok, ...)`: the notebooks' stated facts, checked where a learner can read them, each one a row
of the claims ledger (docs/lessons.md).

A notebook states numbers ("the losses match one process", "small buckets expose less communication").
A bare `assert` would show a learner who changed a parameter an `AssertionError` and a traceback;
`check` prints ✓ or ✗ with the numbers behind the claim instead, and raises only where the notebooks
are tested (`pytest --nbmake`, the browser suite: the tests' conftest sets WORKBENCH_CHECKS=raise, which
the kernels inherit), so CI still fails when a claim stops holding.

Two kinds of claim:
- **asserted**: it holds on any machine (an equality to the byte, a loss within a tolerance, a count).
  Under test a ✗ fails the notebook.
- **timing** (`timing="why it can move"`): it rests on a clock on a shared machine. It is shown, ✓ or ✗
  with its margin and the reason it can move, and never raised: a timing claim that cannot hold under
  load is shown, not asserted (docs/lessons.md, "Checks").

Each check says what it measures (its numbers), in which regime (`regime=`: ranks, model, link; the cores
are added) and with what `margin` it holds: the share by which the measured value clears its limit
(`headroom(value, limit)`: +0.3 holds with 30 % to spare, a negative margin fails). In a notebook the line
is displayed with a machine-readable copy of itself (mime type `CLAIM_MIME`), which
`scripts/claims_ledger.py` reads from the executed notebooks to write the ledger.
"""

from __future__ import annotations

import os
from typing import Any

CLAIM_MIME = "application/vnd.workbench.claim+json"


class CheckFailed(AssertionError):
    """A notebook's claim did not hold while its notebooks were being tested."""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def headroom(value: float, limit: float, *, below: bool = True) -> float:
    """The margin of `value < limit` (or `value > limit` with below=False) as a share of the limit: 0.3 holds
    with 30 % to spare, −0.1 misses by 10 %."""
    scale = abs(limit) or 1.0
    return float((limit - value) / scale if below else (value - limit) / scale)


def _plain(value: Any) -> Any:
    """A number or a short structure for the JSON record (numpy and pandas scalars become Python's)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def check(claim: str, ok: Any, *, timing: str | None = None, margin: float | None = None,
          regime: str | None = None, **numbers: Any) -> bool:
    """Print `✓ claim (numbers)` or `✗ claim (numbers)`; return whether it held.

    Under test (WORKBENCH_CHECKS=raise) an asserted claim that does not hold raises CheckFailed with the
    same line; a timing claim (`timing` names why its clock can move) never raises. `margin`: how far the
    claim clears its limit (see `headroom`); `regime`: where it was measured (ranks, model, link)."""
    held = bool(ok.all() if hasattr(ok, "all") else ok)
    detail = ", ".join(f"{k} = {_fmt(v)}" for k, v in numbers.items())
    line = f"{'✓' if held else '✗'} {claim}" + (f"  ({detail})" if detail else "")
    if margin is not None:
        line += f"  [margin {margin:+.0%}]"
    if timing is not None:
        line += f"  [timing claim, shown not asserted: {timing}]"
    record = {"claim": claim, "held": held, "timing": timing, "margin": None if margin is None else float(margin),
              "regime": regime, "cores": os.cpu_count(), "numbers": {k: _plain(v) for k, v in numbers.items()}}
    _show(line, record)
    if not held and timing is None and os.environ.get("WORKBENCH_CHECKS") == "raise":
        raise CheckFailed(line)
    return held


def _show(line: str, record: dict) -> None:
    """In a notebook: the line, with the record beside it for the ledger; elsewhere: the line, printed."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None  # noqa: N806 — IPython absent: a plain print
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": line, CLAIM_MIME: record}, raw=True)
    else:
        print(line)
