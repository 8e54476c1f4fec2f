"""Schedules in torch pipelining's CSV form, out and in.

The format (`torch.distributed.pipelining.schedules`, `PipelineScheduleMulti._dump_csv` / `_load_csv`
with `format="compute_only"`; torchtitan's `pipeline_parallel_schedule_csv` reads the same): one row per
pipeline rank, one cell per compute action in the order the rank runs them, each written as torch's
`_Action` prints it — stage, kind, microbatch:

    0F0,0F1,0I0,0W0,0F2,...      F forward, B full backward, I input gradient, W weight gradient

An empty cell is an idle slot (torch's generated schedules pad with them); DualPipeV's overlapped pair
`(0F3;3B1)OVERLAP_F_B` is read as an F&B pair (actions.py) and runs here as its two actions in order
(torch's runtime does the same unless a custom overlap function is registered: on a GPU the pairing
overlaps one's compute with the other's communication); communication actions
(SEND_F, RECV_B ... of the "compute_comms" form) and FSDP's UNSHARD/RESHARD/REDUCE_GRAD are skipped when
reading: the transfers are placed here (schedule._lockstep), as torch's `_add_send_recv` places them
there. Which rank holds which stage is read from where each stage's actions are, as torch infers its
`stage_index_to_group_rank`: the loop (stage k on rank k mod p) and the V (ZBV, DualPipeV) are the two
placements this executor runs.
"""

from __future__ import annotations

import csv
import re

from workbench.schedules.actions import Action, Compute, Schedule, Step, compute_cells, flatten
from workbench.schedules.placement import schedule_from_orders
from workbench.schedules.validation import coverage, validate

_ACTION = re.compile(
    r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$"
)


def _cells(cell: str) -> list[str]:
    """A cell's actions: none for an idle slot, the sub-actions of an overlapped pair, else itself."""
    if not cell:
        return []
    if cell.startswith("(") and cell.endswith(")OVERLAP_F_B"):
        return [c.strip() for c in cell[1 : -len(")OVERLAP_F_B")].split(";") if c.strip()]
    return [cell]


def _compute(row_no: int, cell: str) -> Compute | None:
    """A cell's compute action (None: a communication or FSDP action, placed here, not read)."""
    match = _ACTION.match(cell)
    if match is None:
        raise ValueError(f"row {row_no} has {cell!r}, not an action like 2F0, 1I3, 0W1, 1B0")
    stage, kind, mb = match.groups()
    if kind not in ("F", "B", "I", "W"):
        return None
    if not mb:
        raise ValueError(f"row {row_no}: {cell!r} names no microbatch")
    return (kind, int(stage), int(mb))


def csv_rows(s: Schedule) -> list[list[str]]:
    """`s`'s rows of torch's compute-only CSV: per rank its compute actions in order, an F&B pair as
    torch's OVERLAP_F_B cell."""
    return [
        [c + "OVERLAP_F_B" if c.startswith("(") else c for c in compute_cells(acts)]
        for acts in s.actions
    ]


def write_csv(s: Schedule, path: str) -> None:
    """`s` in torch's compute-only CSV (`csv_rows`)."""
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(csv_rows(s))


def read_csv(path: str, m: int | None = None, placement: str = "lockstep") -> Schedule:
    """The schedule a torch pipelining CSV describes, its transfers placed and the whole validated
    (raises ValueError naming what is wrong). `m`: the microbatches the run expects (checked)."""
    orders: list[list[Step]] = []
    with open(path, newline="") as f:
        for row_no, row in enumerate(csv.reader(f)):
            order: list[Step] = []
            for c in row:
                steps = [_compute(row_no, cell) for cell in _cells(c.strip())]
                got = [x for x in steps if x is not None]
                if len(_cells(c.strip())) == 2 and len(got) == 2:  # an F&B pair
                    order.append((got[0], got[1]))
                else:
                    order.extend(got)
            orders.append(order)
    if len(orders) < 2:
        raise ValueError(
            f"{len(orders)} row(s): a pipeline schedule has one row per rank, at least 2"
        )
    p = len(orders)
    flat = [flatten(order) for order in orders]
    stages = 1 + max(st for order in flat for _, st, _ in order)
    micro = 1 + max(mb for order in flat for _, _, mb in order)
    if stages % p:
        raise ValueError(f"{stages} stages do not split evenly over {p} ranks")
    if m is not None and micro != m:
        raise ValueError(f"schedules {micro} microbatches, but the run has microbatches={m}")
    v = stages // p
    where = {st: r for r, order in enumerate(flat) for _, st, _ in order}
    placements = {"loop": {k: k % p for k in range(stages)}}
    if v == 2:
        placements["v"] = {k: k if k < p else 2 * p - 1 - k for k in range(stages)}
        placements["dual"] = placements["v"]  # DualPipe: two pipelines, told apart by what flows
    found = [name for name, ranks in placements.items() if ranks == where]
    if not found:
        raise ValueError(
            f"stages sit on ranks {where}: runnable placements are the loop (stage k on "
            f"rank k mod p) and, with 2 stages per rank, the V (rank r: stages r and 2p − 1 − r)"
        )
    problems = {}
    for name in found:  # the V, else DualPipe's two pipelines (each microbatch through one half)
        bare = Schedule(
            name=f"csv:{path}",
            p=p,
            m=micro,
            v=v,
            actions=[
                [Action(kind=kind, stage=stage, microbatch=mb) for kind, stage, mb in order]
                for order in flat
            ],
            placement=name,
        )
        problems[name] = coverage(bare)  # what each rank runs, before any transfer is placed
    fits = [name for name in found if not problems[name]]
    if not fits:
        raise ValueError("not a valid schedule: " + "; ".join(problems[found[0]][:5]))
    s = schedule_from_orders(
        f"csv:{path}", p, micro, v, orders, stage_placement=fits[0], placement=placement
    )
    errors = validate(s) if placement == "lockstep" else []
    if errors:
        raise ValueError("not a valid schedule: " + "; ".join(errors[:5]))
    return s
