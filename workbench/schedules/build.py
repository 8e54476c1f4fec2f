"""Pipeline schedules, generated as data (actions.py): each rank gets a list of actions, and the same
list is validated (validation.py), simulated without processes (simulator.py), drawn, written to
schedule.json, and executed (executor.py).

Schedules (p stages, m microbatches):
- GPipe (Huang et al. 2019): all m forwards, then all m backwards. Holds m microbatches' activations.
- 1F1B (PipeDream-Flush, Narayanan et al. 2019/2021): warm-up of p − s − 1 forwards on stage s, then
  one forward / one backward alternately (steady state), then the remaining backwards (cool-down).
  Holds at most p − s microbatches.
- Interleaved 1F1B (Narayanan et al. 2021, §2.2): v chunks per rank, microbatches in groups of p;
  warm-up of 2(p − r − 1) + (v − 1)·p forward chunks on rank r. Bubble shrinks by v.
- ZB-H1 and ZBV (Qi et al. 2024): the backward split into I and W, W filling the bubbles
  (zero_bubble.py).
- DualPipe and DualPipeV (DeepSeek-V3, 2024): bidirectional, one microbatch's forward issued with
  another's backward (F&B pairs), the tail split into I and W (dualpipe.py).
- `csv:FILE`: any schedule in torch pipelining's CSV form (torch_csv.py).

Each forward is preceded by the receive of its input and followed by the send of its output (the reverse
for backward), placed by placement.py; the executor posts the transfers between two compute actions as
one batch, which `validate` proves free of deadlock under NCCL's rule (a send may wait for its receive).
"""

from __future__ import annotations

from workbench.schedules.actions import (
    COMPUTE,
    KINDS,
    Action,
    P2PBatch,
    Schedule,
    peak_in_flight,
    peak_pending_w,
)
from workbench.schedules.dualpipe import dualpipe_orders, dualpipev_orders
from workbench.schedules.placement import schedule_from_orders
from workbench.schedules.simulator import ScheduleError, Timeline, simulate
from workbench.schedules.torch_csv import read_csv
from workbench.schedules.validation import validate
from workbench.schedules.zero_bubble import zero_bubble_orders

__all__ = [
    "COMPUTE",
    "KINDS",
    "Action",
    "P2PBatch",
    "Schedule",
    "ScheduleError",
    "Timeline",
    "build_schedule",
    "peak_in_flight",
    "peak_pending_w",
    "schedule_from_orders",
    "simulate",
    "validate",
]
NAMES = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipe", "dualpipev")


# ---- generators -------------------------------------------------------------------------------
def _compute_order(name: str, p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """(kind, stage, microbatch) of the compute actions of one rank, in order."""
    if name == "gpipe":
        return [("F", rank, i) for i in range(m)] + [("B", rank, i) for i in range(m)]
    if name == "1f1b":
        warmup = min(p - rank - 1, m)
        order = [("F", rank, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:  # steady state: one forward, one backward
            order += [("F", rank, f), ("B", rank, b)]
            f, b = f + 1, b + 1
        order += [("B", rank, i) for i in range(b, m)]  # cool-down
        return order
    if name == "interleaved":
        total = m * v

        def fwd(k: int) -> tuple[str, int, int]:
            chunk = (k // p) % v
            return ("F", chunk * p + rank, (k // (p * v)) * p + k % p)

        def bwd(k: int) -> tuple[str, int, int]:
            chunk = v - 1 - (k // p) % v
            return ("B", chunk * p + rank, (k // (p * v)) * p + k % p)

        warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
        order = [fwd(k) for k in range(warmup)]
        f, b = warmup, 0
        while f < total:
            order += [fwd(f), bwd(b)]
            f, b = f + 1, b + 1
        order += [bwd(k) for k in range(b, total)]
        return order
    raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(NAMES)}, csv:FILE")


def build_schedule(name: str, p: int, m: int, v: int = 1, placement: str = "lockstep") -> Schedule:
    """Every rank's actions: its compute actions in the schedule's order, and its transfers placed by
    `placement`: "lockstep" (what runs: `_lockstep`), or "adjacent" — each receive right before the
    action that needs it, each send right after the one that made it, as the executor once posted them,
    one at a time (kept to show why that deadlocks on NCCL: tests/test_pipeline_schedule.py)."""
    if name.startswith("csv:"):
        return read_csv(name[4:], m, placement=placement)
    if name in ("dualpipe", "dualpipev"):
        if v not in (1, 2):
            raise ValueError(f"{name} runs 2 stages per rank: virtual_stages must be 2, got {v}")
        steps = dualpipe_orders(p, m) if name == "dualpipe" else dualpipev_orders(p, m)
        return schedule_from_orders(
            name,
            p,
            m,
            2,
            steps,
            stage_placement="dual" if name == "dualpipe" else "v",
            placement=placement,
        )
    if name in ("zbh1", "zbv"):
        orders, stage_placement, v_needed = zero_bubble_orders(name, p, m)
        if p < 2 or v not in (1, v_needed):
            raise ValueError(
                f"{name} needs pp ≥ 2 and runs {v_needed} stage(s) per rank: pp={p}, virtual_stages={v}"
            )
        return schedule_from_orders(
            name, p, m, v_needed, orders, stage_placement=stage_placement, placement=placement
        )
    if name != "interleaved" and v != 1:
        raise ValueError(
            f"schedule {name!r} runs one stage per rank: virtual_stages must be 1, got {v}"
        )
    if name == "interleaved" and (m % p or p < 2):
        raise ValueError(
            f"interleaved 1F1B needs pp ≥ 2 and microbatches divisible by pp: m={m}, p={p}"
        )
    orders = [_compute_order(name, p, m, v, r) for r in range(p)]
    return schedule_from_orders(name, p, m, v, orders, stage_placement="loop", placement=placement)
