"""Spans read back from a trace's events (the run format: docs/run-format.md): complete spans and async
begin/end pairs joined in one place, communication and compute intervals, and the length of their union and
overlap — what summary.json (analysis/summary.py), the run reader (analysis/run.py) and rank 0's loggers
(engine/logs/tensorboard.py) count time with. No torch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from workbench.trace.recorder import LANES

COMPUTE_CATS = {"forward", "backward", "recompute", "optimizer"}


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def intersection_length(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    xs, ys = _merge(xs), _merge(ys)
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def spans(events: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], float, float, str]]:
    """(event, start_us, duration_us, kind) of every complete span (kind 'span') and every async operation,
    its begin joined to its end (kind 'async', the begin event) — the one place they are paired."""
    opened: dict[Any, dict[str, Any]] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            yield e, e["ts"], e["dur"], "span"
        elif ph == "b":
            opened[(e["name"], str(e["id2"]))] = e
        elif ph == "e":
            b = opened.pop((e["name"], str(e["id2"])), None)
            if b is not None:
                yield b, b["ts"], e["ts"] - b["ts"], "async"


def comm_intervals(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float, float]]:
    """(args, start_us, end_us) of every communication operation, counted once each: blocking
    collectives and p2p from their span, async ones from their begin/end pair (the host's launch spans,
    category `launch`, are not operations)."""
    out = []
    for e, start, dur, kind in spans(events):
        if kind == "async" or (
            e.get("cat") in ("collective", "p2p") and not e.get("args", {}).get("async")
        ):
            out.append((e["args"], start, start + dur))
    return out


def compute_intervals(
    events: list[dict[str, Any]], since: float = 0.0
) -> list[tuple[float, float]]:
    """(start_us, end_us) of the forward / backward / recompute / optimizer spans on the compute lane that
    start at or after `since`."""
    return [
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X"
        and e["cat"] in COMPUTE_CATS
        and e["tid"] == LANES["compute"]
        and e["ts"] >= since
    ]
