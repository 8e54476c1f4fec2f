"""How often to checkpoint (Young 1974, "A first order approximation to the optimum checkpoint interval";
Daly 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps").

With a checkpoint costing δ seconds and failures arriving on average every M seconds (the job's mean time
between failures: one machine's MTBF divided by the number of machines), checkpointing every τ seconds
loses, per second of training,

    δ / τ            the time spent writing checkpoints
    + τ / (2M)       the work redone after a failure (on average half an interval)
    (+ the restart itself, R / M, which no interval changes)

and the sum is smallest at Young's τ* = √(2 δ M); Daly's refinement √(2 δ M) − δ matters when δ is not
small against M.
"""

from __future__ import annotations

import math


def young_daly_interval(checkpoint_s: float, mtbf_s: float, daly: bool = True) -> float:
    """The checkpoint interval (seconds) that loses the least time: √(2δM), minus δ with Daly's term."""
    tau = math.sqrt(2 * checkpoint_s * mtbf_s)
    return max(tau - checkpoint_s, checkpoint_s) if daly else tau


def checkpoint_overhead(
    interval_s: float, checkpoint_s: float, mtbf_s: float, restart_s: float = 0.0
) -> float:
    """The fraction of time lost to writing checkpoints and redoing work after failures (first order)."""
    return checkpoint_s / interval_s + interval_s / (2 * mtbf_s) + restart_s / mtbf_s
