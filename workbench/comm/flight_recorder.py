"""A flight recorder for collectives (after NCCL's, TORCH_NCCL_TRACE_BUFFER_SIZE): each rank keeps its
last N operations — op, group and its ranks, per-group sequence number, label, step, and whether it
finished — so that when a job hangs or dies, every rank's error file says where it stood.

Collectives are issued in the same order on every member of a group, so sequence numbers line up across
ranks: a member whose newest entry in a group has a lower `seq` than the others' never reached the
operation they are blocked in. `workbench doctor RUN` (workbench/analysis/doctor.py) reads this and says who is
behind.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Container, Sequence
from typing import Any

KEPT = 64


class FlightRecorder:
    def __init__(self, size: int = KEPT) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=size)

    def start(self, args: dict[str, Any]) -> None:
        self.entries.append(
            {k: args.get(k) for k in ("op", "group", "group_ranks", "seq", "label", "step", "peer")}
            | {"state": "started", "started_unix": time.time()}
        )

    def done(self, args: dict[str, Any]) -> None:
        for entry in reversed(self.entries):
            if (entry["group"], entry["seq"], entry["op"], entry["peer"]) == (
                args.get("group"),
                args.get("seq"),
                args.get("op"),
                args.get("peer"),
            ):
                entry["state"] = "done"
                return

    def to_list(self) -> list[dict[str, Any]]:
        return list(self.entries)


def lagging(
    newest_seq: dict[int, int], members: Sequence[int], reported: Container[int]
) -> tuple[int, list[int]]:
    """The furthest sequence number a group's members reached, and the members that left a record and are
    below it: the ones the others wait for (a collective needs every member). Our records and torch's
    dumps (comm/torch_flight_recorder.py) are both read this way."""
    top = max(newest_seq.values(), default=0)
    return top, [r for r in members if r in reported and newest_seq.get(r, 0) < top]
