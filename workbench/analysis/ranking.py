"""Does a prediction keep the order of what it predicts? Kendall's τ between predicted and measured values,
and whether the predicted best is the measured best (or within the measurement's noise of it) — what a
planner is for. No torch.
"""

from __future__ import annotations

from itertools import combinations


def kendall_tau(predicted: list[float], measured: list[float]) -> float:
    """τ-b: (concordant − discordant) pairs over the pairs, ties counted as in τ-b; 1 is the same order,
    −1 the reverse."""
    if len(predicted) != len(measured) or len(predicted) < 2:
        raise ValueError(
            f"two lists of the same length ≥ 2 needed: got {len(predicted)} and {len(measured)}"
        )
    concordant = discordant = ties_p = ties_m = 0
    for i, j in combinations(range(len(predicted)), 2):
        dp, dm = predicted[i] - predicted[j], measured[i] - measured[j]
        if dp == 0 and dm == 0:
            continue
        if dp == 0:
            ties_p += 1
        elif dm == 0:
            ties_m += 1
        elif (dp > 0) == (dm > 0):
            concordant += 1
        else:
            discordant += 1
    n = concordant + discordant
    denominator = ((n + ties_p) * (n + ties_m)) ** 0.5
    return (concordant - discordant) / denominator if denominator else 0.0


def best_kept(
    predicted: list[float], measured: list[float], spread: list[float] | None = None
) -> bool:
    """Whether the predicted fastest is the measured fastest, or measured within the noise (`spread`: each
    one's measured half-range; none: exact) of it."""
    i = min(range(len(predicted)), key=predicted.__getitem__)
    j = min(range(len(measured)), key=measured.__getitem__)
    noise = (spread[i] + spread[j]) if spread else 0.0
    return i == j or measured[i] - measured[j] <= noise


def order_line(rows: list[dict], of: str) -> str:
    """A benchmark's line on order: Kendall's τ of `rows`' predicted_ms against their measured_ms, and whether
    the predicted fastest is the measured fastest within the rows' spread (half the range of runs_ms)."""
    predicted, measured = [r["predicted_ms"] for r in rows], [r["measured_ms"] for r in rows]
    spread = [(max(r["runs_ms"]) - min(r["runs_ms"])) / 2 for r in rows]
    return (
        f"Kendall's τ between the predicted and the measured order of the {of}: "
        f"{kendall_tau(predicted, measured):.2f}; predicted fastest is the measured fastest (within its "
        f"spread): {best_kept(predicted, measured, spread)}"
    )
