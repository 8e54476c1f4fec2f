"""The `pipeline` exercise's table (exercises/pipeline.py): read and checked before any process starts — each
cell an action, each rank running every microbatch's F and B once (the B after its F), no deadlock (the table
replayed with each F waiting for the activation from the rank before and each B for the gradient from the rank
after: a table that stops names the cycle), then the transfers placed and proved free of deadlock under NCCL's
rule (schedules/placement.py, schedules/validation.py)."""

from __future__ import annotations

import re
from typing import Any

from workbench.schedules.actions import Schedule
from workbench.schedules.placement import schedule_from_orders
from workbench.schedules.validation import validate

#: the ranks and microbatches a table may have (`try_schedule`)
RANKS, MICROBATCHES = range(2, 5), range(1, 17)

_ACTION = re.compile(r"^([FB])(\d+)$")


class TableError(ValueError):
    """A table that is not a schedule: the message names the rank, the cell and what is valid."""


def layers(p: int) -> int:
    """The tiny model's layers for p ranks: 4, split evenly (3 for p = 3)."""
    return p * max(1, 4 // p)


def parse(table: Any) -> list[list[tuple[str, int]]]:
    """Each rank's actions as (F or B, microbatch); TableError naming the first bad row or cell."""
    if not isinstance(table, list | tuple) or not all(isinstance(r, list | tuple) for r in table):
        raise TableError(
            f"one_f_one_b must be a list of p lists, one per rank, of actions like 'F0', 'B0'; got "
            f"{type(table).__name__}"
            + ("" if not isinstance(table, list | tuple) else " holding a non-list row")
        )
    if len(table) not in RANKS:
        raise TableError(
            f"your table has {len(table)} row{'s' * (len(table) != 1)}: one per pipeline rank, "
            f"{RANKS[0]} to {RANKS[-1]} (the task: 4)"
        )
    orders = []
    for r, row in enumerate(table):
        if not row:
            raise TableError(f"rank {r}'s row is empty: every rank runs each microbatch's F and B")
        orders.append([_action(r, i, cell) for i, cell in enumerate(row)])
    m = 1 + max(mb for order in orders for _, mb in order)
    if m not in MICROBATCHES:
        raise TableError(
            f"your table runs microbatch {m - 1}: this exercise trains with up to "
            f"{MICROBATCHES[-1]} microbatches (0 … {MICROBATCHES[-1] - 1}; the task: 8)"
        )
    return orders


def _action(rank: int, i: int, cell: Any) -> tuple[str, int]:
    match = _ACTION.match(cell.strip()) if isinstance(cell, str) else None
    if match is not None:
        return match[1], int(match[2])
    hint = ""
    if isinstance(cell, str) and re.match(r"^\d+[FB]\d+$", cell.strip()):
        hint = f" (the row is the rank: write {cell.strip().lstrip('0123456789')!r})"
    elif isinstance(cell, str) and re.match(r"^[IW]\d+$", cell.strip()):
        hint = " (this exercise runs whole backwards, B; zero bubble's I and W are not taken)"
    elif isinstance(cell, str) and re.match(r"^[fb]\d+$", cell.strip()):
        hint = f" (capitals: {cell.strip().upper()!r})"
    raise TableError(
        f"rank {rank}, cell {i}: {cell!r} is not an action{hint}; valid: 'F' or 'B' and a microbatch "
        "number, e.g. 'F3' (forward of microbatch 3) or 'B0' (backward of microbatch 0)"
    )


def coverage_problems(orders: list[list[tuple[str, int]]]) -> list[str]:
    """Each rank runs every microbatch's F and B once, the B after its F: what does not, in rank order."""
    m = 1 + max(mb for order in orders for _, mb in order)
    problems = []
    for r, order in enumerate(orders):
        for kind in ("F", "B"):
            for mb in range(m):
                n = order.count((kind, mb))
                if n != 1:
                    times = {0: "never runs", 2: "runs"}.get(n, "runs")
                    count = {0: "", 2: " twice"}.get(n, f" {n} times")
                    problems.append(f"rank {r} {times} {kind}{mb}{count}")
        for mb in range(m):
            if ("B", mb) in order and ("F", mb) in order:
                if order.index(("B", mb)) < order.index(("F", mb)):
                    problems.append(
                        f"rank {r} runs B{mb} before F{mb}: a backward needs the activations its "
                        "forward saved"
                    )
    return problems


def _source(p: int, r: int, kind: str) -> int | None:
    """The rank whose action of the same name this one waits for (None: the pipeline's end)."""
    src = r - 1 if kind == "F" else r + 1
    return src if 0 <= src < p else None


def deadlock(orders: list[list[tuple[str, int]]]) -> str | None:
    """Replay the table with each F waiting for the rank before's F, each B for the rank after's B (the
    transfers as unbounded queues): None if every rank finishes, else the cycle of ranks waiting on each
    other, named action by action."""
    p = len(orders)
    pos, done = [0] * p, [set[tuple[str, int]]() for _ in range(p)]
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, mb = orders[r][pos[r]]
                src = _source(p, r, kind)
                if src is not None and (kind, mb) not in done[src]:
                    break
                done[r].add((kind, mb))
                pos[r], moved = pos[r] + 1, True
    if all(pos[r] == len(orders[r]) for r in range(p)):
        return None
    # each stuck rank waits for another stuck one (every action it waits for is in that rank's row, not
    # yet run): following them from the first comes back to a rank already met, the cycle's start
    chain: list[int] = []
    at: int | None = min(q for q in range(p) if pos[q] < len(orders[q]))
    while at is not None and at not in chain:
        chain.append(at)
        at = _source(p, at, orders[at][pos[at]][0])
    chain = chain[chain.index(at) :] if at is not None else chain
    words = {"F": "activation", "B": "gradient"}
    parts = []
    for k, q in enumerate(chain):
        kind, mb = orders[q][pos[q]]
        a = f"{kind}{mb}"
        src = _source(p, q, kind)
        head = f"rank {q}'s {a} waits" if k == 0 else f", which is waiting at {a}"
        parts.append(f"{head} for {a}'s {words[kind]} from rank {src}")
    first = chain[0]
    kind, mb = orders[first][pos[first]]
    last_kind, last_mb = orders[chain[-1]][pos[chain[-1]]]
    return (
        "".join(parts)
        + f" — and rank {first} runs {last_kind}{last_mb} only after its {kind}{mb}: a cycle, no rank "
        f"can move. A rank can run B_i only once every rank after it has, and F_i once every rank before "
        f"it has: 1F1B's rank r runs p − r forwards before its first backward (here "
        f"{', '.join(str(p - q) for q in range(p))}: p − r − 1 to fill the pipeline, then one forward and "
        "one backward in turn)."
    )


def check_table(table: Any) -> tuple[Schedule | None, str]:
    """The learner's table as a validated Schedule (its transfers placed), or None and what is wrong."""
    try:
        orders = parse(table)
    except TableError as e:
        return None, str(e)
    problems = coverage_problems(orders)
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        return None, "; ".join(problems[:4]) + more
    if (stuck := deadlock(orders)) is not None:
        return None, f"your table deadlocks: {stuck}"
    m = 1 + max(mb for order in orders for _, mb in order)
    p = len(orders)
    steps = [[(kind, r, mb) for kind, mb in order] for r, order in enumerate(orders)]
    schedule = schedule_from_orders("yours", p, m, 1, steps)
    errors = validate(schedule)
    if errors:  # the replay above should have caught it: say what the validator found
        return None, "its transfers, placed, fail the schedule rule: " + "; ".join(errors[:3])
    return schedule, ""


def forwards_before_backward(schedule: Schedule) -> list[int]:
    """Per rank, the forwards it runs before its first backward (1F1B's rank r: p − r)."""
    found = []
    for acts in schedule.actions:
        kinds = [a.kind for a in acts if a.kind in ("F", "B")]
        found.append(kinds.index("B") if "B" in kinds else len(kinds))
    return found


def reference_table(p: int, m: int) -> list[list[str]]:
    """1F1B at p and m as a table: the workbench's generator (schedules/build.py)."""
    from workbench.schedules.build import build_schedule

    s = build_schedule("1f1b", p, m)
    return [[f"{a.kind}{a.microbatch}" for a in acts if a.kind in ("F", "B")] for acts in s.actions]
