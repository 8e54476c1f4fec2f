"""α–β of a run's own collectives: the cost model a what-if re-costs operations with when it changes their
group size or their bytes (analysis/what_if.py). No torch.
"""

from __future__ import annotations

import statistics

from workbench.analysis.execution_graph import OpNode
from workbench.trace.bandwidth import bus_factor

#: ring steps of a collective over n ranks: the α's it pays (comm/emulated_link.py counts them alike)
STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: n - 1,
    "all_gather": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
}


def fit(nodes: list[OpNode]) -> tuple[float, float]:
    """(α µs per ring step, µs per byte sent) fitted by least squares to cost = steps(n)·α + bus(n)·bytes·c,
    each operation's cost its members' mean (the cost and what each took beyond it), the median of each
    (op, ranks, bytes) (one slow minute does not tilt the fit); clamped at 0; with one size only, all of
    the cost per ring step."""
    kinds: dict[tuple[str, int, int], list[float]] = {}
    for n in nodes:
        if n.op in STEPS and len(n.members) > 1:
            kinds.setdefault((n.op, len(n.members), n.nbytes), []).append(
                n.cost_us + sum(n.extra_us.values()) / len(n.members)
            )
    rows = [
        (STEPS[op](k), bus_factor(op, k) * b, statistics.median(c))
        for (op, k, b), c in kinds.items()
    ]
    if not rows:
        return 0.0, 0.0
    sxx = sum(a * a for a, _, _ in rows)
    syy = sum(b * b for _, b, _ in rows)
    sxy = sum(a * b for a, b, _ in rows)
    det = sxx * syy - sxy * sxy
    if abs(det) <= 1e-9 * max(sxx * syy, 1e-30):
        return statistics.mean(c / a for a, _, c in rows), 0.0
    sxc = sum(a * c for a, _, c in rows)
    syc = sum(b * c for _, b, c in rows)
    alpha, per_byte = (syy * sxc - sxy * syc) / det, (sxx * syc - sxy * sxc) / det
    if alpha < 0:
        return 0.0, syc / syy
    if per_byte < 0:
        return sxc / sxx, 0.0
    return alpha, per_byte


def cost(op: str, n: int, nbytes: float, ab: tuple[float, float]) -> float:
    """µs of one collective over n ranks with the fitted (α, per-byte)."""
    return STEPS[op](n) * ab[0] + bus_factor(op, n) * nbytes * ab[1] if n > 1 else 0.0


def replica_group(node: OpNode) -> bool:
    """Whether the operation is over the ranks that hold the same parameters (dp, or dp×cp)."""
    return node.group in ("dp", "dp_cp")
