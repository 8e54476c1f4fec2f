"""A node lost and the run recovered: when the node was lost, when the survivors noticed, when the group
re-formed, and when that group finished its first step — read from the clock's records in the run directory:

    node_events.jsonl                  when a node was lost, and how (launching/lose_node.py writes it). Where
                                       nothing was recorded, the lost ranks' last finished step stands in —
                                       the last moment they are known to have been alive —, so the times
                                       measured from it are upper bounds.
    attempts/restart-<n>/error_rank*   the failed attempt's errors: the survivors' first one is the detection
                                       (their collective failed — at once on a reset, after the process-group
                                       timeout on silence)
    each attempt's trace headers       its ranks and their nodes (`node`), and the group's start
                                       (`epoch_unix_us`: the barrier every rank of the new group passed)
    each attempt's ProfilerStep# spans the re-formed group's first step, and when every rank had finished it

An attempt lost a node when a node of its group is missing from the next group (an elastic run going on with
the nodes left), or when node_events.jsonl says one was lost while it ran (a run that waited for the node to
come back has the same nodes before and after). A restart with neither — one rank's own failure — is no
node loss. `recoveries(run_dir)` returns one Recovery per loss; `Run.recoveries` and `workbench doctor` show
them. No torch.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from workbench.trace.merge import rank_trace_paths, read_trace
from workbench.trace.recorder import recover_partial

#: what happened to a local cluster's nodes during a run (launching/lose_node.py), in its directory
EVENTS = "node_events.jsonl"
_HOW = {
    "kill": "every process SIGKILLed",
    "partition": "its link cut",
    None: "not recorded: its last finished step stands in",
}


@dataclass(kw_only=True)
class Recovery:
    """One node loss and the recovery from it; times are wall-clock (time.time())."""

    attempt: int  # the attempt that lost it: its files are in attempts/restart-<attempt>/
    nodes: list[str]  # the node(s) lost
    ranks: list[int]  # their ranks in that attempt
    how: str | None  # 'kill' or 'partition' as recorded; None where nothing was
    lost_at: float
    detected_at: float | None  # the survivors' first error
    detected_by: str  # that error: "rank 0 (node …): RuntimeError: …"
    regrouped_at: float | None  # the next group's start (every rank of it up and joined)
    first_step_at: float | None  # when every rank of the next group had finished its first step
    last_step: int | None  # the last step every rank of the lost attempt finished
    resumed_step: int | None  # the next group's first step (from the newest checkpoint)
    nodes_after: list[str] = field(default_factory=list)
    world_before: int = 0
    world_after: int = 0
    back_at: float | None = None  # a partitioned node reconnected (recorded)

    @property
    def detect_s(self) -> float | None:
        return None if self.detected_at is None else self.detected_at - self.lost_at

    @property
    def regroup_s(self) -> float | None:
        return None if self.regrouped_at is None else self.regrouped_at - self.lost_at

    @property
    def recover_s(self) -> float | None:
        return None if self.first_step_at is None else self.first_step_at - self.lost_at

    def describe(self) -> str:
        """A few lines: what was lost, and each time from the loss."""
        ranks = ", ".join(map(str, self.ranks)) or "?"
        when = time.strftime("%H:%M:%S", time.localtime(self.lost_at))
        lines = [
            f"node {', '.join(self.nodes)} (rank {ranks}) lost at {when} in attempt {self.attempt} "
            f"({_HOW.get(self.how, self.how)})"
            + (f", after step {self.last_step}" if self.last_step is not None else "")
        ]
        if self.detect_s is not None:
            lines.append(f"  detected  {self.detect_s:+7.2f} s  {self.detected_by}")
        if self.back_at is not None:
            lines.append(f"  back      {self.back_at - self.lost_at:+7.2f} s  its link up again")
        if self.regroup_s is not None:
            on = ", ".join(self.nodes_after)
            lines.append(
                f"  re-formed {self.regroup_s:+7.2f} s  {self.world_after} rank(s) on {on} "
                f"(world {self.world_before} → {self.world_after})"
                + (_resumed(self.resumed_step, self.last_step))
            )
        if self.recover_s is not None:
            lines.append(
                f"  recovered {self.recover_s:+7.2f} s  the re-formed group's first step done"
            )
        return "\n".join(lines)


def _resumed(step: int | None, last: int | None) -> str:
    if step is None:
        return ""
    redone = (
        ""
        if last is None or last < step
        else f"; step {step} redone"
        if last == step
        else f"; steps {step}–{last} redone"
    )
    return f", resuming at step {step} (the newest checkpoint{redone})"


@dataclass(kw_only=True)
class _Attempt:
    """What one attempt's files say: each rank's node, the group's start, each rank's finished steps
    (step → wall-clock end), its errors."""

    nodes: dict[int, str]
    epoch: float | None
    steps: dict[int, dict[int, float]]
    errors: list[dict[str, Any]]

    def finished(self) -> int | None:
        """The last step every rank finished."""
        last = [max(s) for s in self.steps.values() if s]
        return min(last) if last and len(last) == len(self.steps) else None

    def first_step(self) -> tuple[int, float] | None:
        """The group's first step, and when every rank had finished it."""
        firsts = [min(s) for s in self.steps.values() if s]
        if not firsts:
            return None
        k = min(firsts)
        ends = [s[k] for s in self.steps.values() if k in s]
        return k, max(ends)


def recoveries(run_dir: str) -> list[Recovery]:
    """Every node loss of the run in `run_dir` the run recovered from, oldest first."""
    dirs = sorted(
        glob.glob(os.path.join(run_dir, "attempts", "restart-*")),
        key=lambda d: int(d.rsplit("-", 1)[1]),
    )
    attempts = [_read_attempt(d) for d in [*dirs, run_dir]]
    events = read_events(run_dir)
    out = []
    for n, (this, after) in enumerate(zip(attempts, attempts[1:], strict=False)):
        recovery = _loss(n, this, after, events)
        if recovery is not None:
            out.append(recovery)
    return out


def read_events(run_dir: str) -> list[dict[str, Any]]:
    """node_events.jsonl's rows ({"node", "event", "time"}), oldest first; [] where nothing was recorded."""
    path = os.path.join(run_dir, EVENTS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return sorted((json.loads(line) for line in f if line.strip()), key=lambda e: e["time"])


def _loss(n: int, this: _Attempt, after: _Attempt, events: list[dict[str, Any]]) -> Recovery | None:
    """Attempt `n`'s node loss, if it had one (the module's docstring says when)."""
    start, end = this.epoch or 0.0, after.epoch or float("inf")
    recorded = [e for e in events if e["event"] != "reconnect" and start <= e["time"] < end]
    lost = sorted(
        {e["node"] for e in recorded} | (set(this.nodes.values()) - set(after.nodes.values()))
    )
    if not lost:
        return None
    ranks = sorted(r for r, node in this.nodes.items() if node in lost)
    if recorded:
        lost_at, how = recorded[0]["time"], recorded[0]["event"]
    else:
        last = [max(this.steps[r].values()) for r in ranks if this.steps.get(r)]
        if not last:
            return None
        lost_at, how = max(last), None
    survivors = [
        e for e in this.errors if this.nodes.get(e["rank"]) not in lost and e["time"] >= lost_at
    ]
    first = min(survivors, key=lambda e: e["time"], default=None)
    back = [
        e["time"]
        for e in events
        if e["event"] == "reconnect" and e["node"] in lost and lost_at <= e["time"] < end
    ]
    resumed = after.first_step()
    return Recovery(
        attempt=n,
        nodes=lost,
        ranks=ranks,
        how=how,
        lost_at=lost_at,
        detected_at=first["time"] if first else None,
        detected_by=_error_line(first, this.nodes) if first else "",
        regrouped_at=after.epoch,
        first_step_at=resumed[1] if resumed else None,
        last_step=this.finished(),
        resumed_step=resumed[0] if resumed else None,
        nodes_after=sorted(set(after.nodes.values())),
        world_before=len(this.nodes),
        world_after=len(after.nodes),
        back_at=back[0] if back else None,
    )


def _error_line(err: dict[str, Any], nodes: dict[int, str], limit: int = 240) -> str:
    """The error in one line: gloo's source locations and advice left out, the peer's address kept."""
    message = " ".join(str(err.get("message", "")).split())
    message = re.sub(r"\[[^\]\s]*\.(cc|cpp|h|hpp):\d+\] ", "", message)
    message = message.split(" This is typically caused by")[0]
    message = re.sub(rf"^rank {err['rank']}: ", "", message)
    if len(message) > limit:
        message = message[:limit].rsplit(" ", 1)[0] + " …"
    node = nodes.get(err["rank"], "?")
    return f"rank {err['rank']} ({node}): {err.get('type', 'error')}: {message}"


def _read_attempt(path: str) -> _Attempt:
    traces = _traces(path)
    nodes, steps, epochs = {}, {}, []
    for t in traces:
        info, rank = t["workbench"], t["distributedInfo"]["rank"]
        if "epoch_unix_us" not in info:
            continue
        epoch = info["epoch_unix_us"] / 1e6
        epochs.append(epoch)
        nodes[rank] = info.get("node", "?")
        steps[rank] = {
            int(e["name"].split("#", 1)[1]): epoch + (e["ts"] + e["dur"]) / 1e6
            for e in t["traceEvents"]
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
        }
    errors = []
    for p in glob.glob(os.path.join(path, "error_rank*.json")):
        with open(p) as f:
            errors.append(json.load(f))
    return _Attempt(nodes=nodes, epoch=min(epochs, default=None), steps=steps, errors=errors)


def _traces(path: str) -> list[dict[str, Any]]:
    """Each rank's trace in `path`: its file, else what its stream holds (a rank killed mid-run)."""
    out = {rank: read_trace(p) for rank, p in rank_trace_paths(path).items()}
    for stream in glob.glob(os.path.join(path, "trace_rank*.partial.jsonl")):
        m = re.search(r"trace_rank(\d+)\.partial", stream)
        if m is None or int(m.group(1)) in out:
            continue
        try:
            out[int(m.group(1))] = recover_partial(stream)
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return list(out.values())
