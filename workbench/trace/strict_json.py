"""JSON that every reader parses: Python's `json` writes NaN and Infinity bare, which strict readers (jq,
JavaScript's JSON.parse, most loaders outside Python) refuse. Here a non-finite number is written as null,
and a row says which of its keys were not finite (`nonfinite`: their names, and "nan" / "inf" / "-inf").
No torch."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """`obj` with every non-finite float (at any depth) replaced by None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def row(values: dict[str, Any]) -> dict[str, Any]:
    """A metrics row made strict: each top-level non-finite number null, and `nonfinite` naming what it was."""
    bad = {k: str(v) for k, v in values.items() if isinstance(v, float) and not math.isfinite(v)}
    out = finite(values)
    if bad:
        out["nonfinite"] = bad
    return out


def dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps of `finite(obj)`, refusing anything non-finite that is left (allow_nan=False)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
