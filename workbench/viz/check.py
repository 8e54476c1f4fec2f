"""`check(claim, holds, **numbers)`: the notebooks' stated facts, checked where a learner can read them, each
one a row of the claims ledger (docs/lessons.md), and each one shown able to fail.

A notebook states numbers ("the losses match one process", "small buckets expose less communication").
A bare `assert` would show a learner who changed a parameter an `AssertionError` and a traceback;
`check` prints ✓ or ✗ with the numbers behind the claim instead, and raises only where the notebooks
are tested (`pytest --nbmake`, the browser suite: the tests' conftest sets WORKBENCH_CHECKS=raise, which
the kernels inherit), so CI still fails when a claim stops holding.

The condition `holds` is an expression over the numbers shown beside it, and nothing else
(`check("measured = predicted", "measured == predicted", measured=m, predicted=p)`): what the learner reads
is what decides. That makes every check testable: `check` looks for a wrong value of one of its numbers that
would make it fail (5 % off, one more, twice, zero, one element flipped ...) and records the first it finds
(`fails_on`, a column of the ledger). A check no wrong value can fail is a check that cannot fail; under test
that is an error, whatever the claim's outcome.

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

import builtins
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

CLAIM_MIME = "application/vnd.workbench.claim+json"

# What a condition may call besides its numbers (and numpy as np): enough to say "every", "at most", "in".
_SAFE = {
    name: getattr(builtins, name)
    for name in (
        "abs",
        "all",
        "any",
        "len",
        "list",
        "max",
        "min",
        "range",
        "round",
        "set",
        "sorted",
        "sum",
        "tuple",
        "zip",
        "float",
        "int",
        "bool",
        "str",
    )
}


class CheckFailed(AssertionError):
    """A notebook's claim did not hold (or could not fail) while its notebooks were being tested."""


def _fmt(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{value:.4g}"
    if isinstance(value, np.ndarray) or hasattr(value, "to_numpy"):
        return "[" + ", ".join(_fmt(v) for v in np.asarray(value).tolist()) + "]"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def headroom(value: float, limit: float, *, below: bool = True) -> float:
    """The margin of `value < limit` (or `value > limit` with below=False) as a share of the limit: 0.3 holds
    with 30 % to spare, −0.1 misses by 10 %."""
    scale = abs(limit) or 1.0
    return float((limit - value) / scale if below else (value - limit) / scale)


def _plain(value: Any) -> Any:
    """A number or a short structure for the JSON record (numpy and pandas values become Python's)."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _operand(value: Any) -> Any:
    """A number as the condition sees it: sequences (lists, Series, arrays) become numpy arrays, so that
    `measured == predicted` compares element by element and holds when every element does."""
    if isinstance(value, str):
        return value
    if hasattr(value, "to_numpy"):
        return value.to_numpy()
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


def evaluate(holds: str, values: dict[str, Any]) -> bool:
    """Whether the condition holds for these numbers (an array result holds when all of it does)."""
    # the notebook's own condition
    result = eval(holds, {"__builtins__": _SAFE, "np": np, **values})
    return bool(np.all(result))


def _numeric(x: float) -> Iterator[float]:
    """Wrong values of one number, the nearest first."""
    for w in (x * 1.05, x * 0.95, x + 1, x - 1, x * 2, x / 2, x * 10, x / 10, -x, 0.0, 1e9, -1e9):
        if w != x:
            yield w


def wrong_values(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """(what was changed, the changed value) for one number: scalars shifted, one element of an array at a
    time (its first and its last) or the whole of it, a flag flipped, a text emptied."""
    if isinstance(value, (bool, np.bool_)):
        yield f"{name} = {not value}", not value
    elif isinstance(value, (int, float, np.integer, np.floating)):
        for w in _numeric(float(value)):
            yield f"{name} = {w:.4g}", w
    elif isinstance(value, str):
        yield f'{name} = ""', ""
        swapped = value.translate(str.maketrans("0123456789", "1234567890"))
        if swapped != value:
            yield f"{name} with its digits changed", swapped
    elif isinstance(value, np.ndarray) and value.size:
        flat = value.reshape(-1)
        for i in sorted({0, flat.size - 1}):
            if flat.dtype == bool:
                changed = flat.copy()
                changed[i] = not changed[i]
                yield f"{name}[{i}] = {changed[i]}", changed.reshape(value.shape)
            elif np.issubdtype(flat.dtype, np.number):
                for w in _numeric(float(flat[i])):
                    changed = flat.astype(float)
                    changed[i] = w
                    yield f"{name}[{i}] = {w:.4g}", changed.reshape(value.shape)
            else:
                changed = flat.astype(object)
                changed[i] = ""
                yield f'{name}[{i}] = ""', changed.reshape(value.shape)
        if np.issubdtype(value.dtype, np.number) and flat.size > 1:
            for factor in (1.05, 2.0, 0.5, -1.0):
                yield f"{name} × {factor:g}", value.astype(float) * factor


def fails_on(holds: str, values: dict[str, Any]) -> str | None:
    """The first wrong value of one number that makes the condition false (None: no wrong value does)."""
    for name, value in values.items():
        for what, wrong in wrong_values(name, value):
            try:
                if not evaluate(holds, {**values, name: wrong}):
                    return what
            except (ArithmeticError, ValueError, TypeError, IndexError):
                continue  # a wrong value the condition cannot take (a length, an index): not this one
    return None


def check(
    claim: str,
    holds: str,
    *,
    timing: str | None = None,
    margin: float | None = None,
    regime: str | None = None,
    **numbers: Any,
) -> bool:
    """Print `✓ claim (numbers)` or `✗ claim (numbers)`; return whether it held.

    `holds` is the condition, an expression over `numbers` (and numpy as np). Under test
    (WORKBENCH_CHECKS=raise) an asserted claim that does not hold raises CheckFailed with the same line, and
    any claim no wrong value of its numbers can fail raises too; a timing claim (`timing` names why its clock
    can move) never raises for its outcome. `margin`: how far the claim clears its limit (see `headroom`);
    `regime`: where it was measured (ranks, model, link)."""
    if not isinstance(holds, str):
        raise TypeError(
            f"check({claim!r}): state the condition as an expression over its numbers, e.g. "
            f"'measured == predicted', not the value {holds!r}, so that a wrong value can be shown "
            "to fail it"
        )
    values = {k: _operand(v) for k, v in numbers.items()}
    held = evaluate(holds, values)
    counter = fails_on(holds, values) if held else "the measured values themselves"
    detail = ", ".join(f"{k} = {_fmt(v)}" for k, v in numbers.items())
    line = f"{'✓' if held else '✗'} {claim}" + (f"  ({detail})" if detail else "")
    if margin is not None:
        line += f"  [margin {margin:+.0%}]"
    if timing is not None:
        line += f"  [timing claim, shown not asserted: {timing}]"
    record = {
        "claim": claim,
        "held": held,
        "holds": holds,
        "fails_on": counter,
        "timing": timing,
        "margin": None if margin is None else float(margin),
        "regime": regime,
        "cores": os.cpu_count(),
        "numbers": {k: _plain(v) for k, v in numbers.items()},
    }
    _show(line, record)
    if os.environ.get("WORKBENCH_CHECKS") == "raise":
        if counter is None:
            raise CheckFailed(
                f"{line}\nthis check cannot fail: no wrong value of its numbers makes `{holds}` "
                "false; state the condition over the numbers that decide it"
            )
        if not held and timing is None:
            raise CheckFailed(line)
    return held


def _show(line: str, record: dict) -> None:
    """In a notebook: the line, with the record beside it for the ledger; elsewhere: the line, printed."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None  # IPython absent: a plain print
    if get_ipython is not None and get_ipython() is not None:
        display({"text/plain": line, CLAIM_MIME: record}, raw=True)
    else:
        print(line)
