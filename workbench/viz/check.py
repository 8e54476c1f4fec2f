"""`check(claim, ok, **numbers)`: the notebooks' stated facts, checked where a learner can read them.

A notebook states numbers ("the losses match one process", "small buckets expose less communication").
A bare `assert` would show a learner who changed a parameter an `AssertionError` and a traceback;
`check` prints ✓ or ✗ with the numbers behind the claim instead, and raises only where the notebooks
are tested (`pytest --nbmake`, the browser suite: the tests' conftest sets WORKBENCH_CHECKS=raise, which
the kernels inherit), so CI still fails when a claim stops holding.
"""

from __future__ import annotations

import os
from typing import Any


class CheckFailed(AssertionError):
    """A notebook's claim did not hold while its notebooks were being tested."""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def check(claim: str, ok: Any, **numbers: Any) -> bool:
    """Print `✓ claim (numbers)` or `✗ claim (numbers)`; return whether it held. Under test
    (WORKBENCH_CHECKS=raise) a claim that does not hold raises CheckFailed with the same line."""
    held = bool(ok.all() if hasattr(ok, "all") else ok)
    detail = ", ".join(f"{k} = {_fmt(v)}" for k, v in numbers.items())
    line = f"{'✓' if held else '✗'} {claim}" + (f"  ({detail})" if detail else "")
    print(line)
    if not held and os.environ.get("WORKBENCH_CHECKS") == "raise":
        raise CheckFailed(line)
    return held
