"""`workbench doctor RUN`: why a run failed, from what its ranks left — who failed first, and for a hang,
which ranks were at which collective: our flight recorder's view (comm/flight_recorder.py, in each error
file) and torch's own (`fr_trace_rank{r}`, written by NCCL's watchdog on a timeout or by the failing rank:
comm/torch_flight_recorder.py), side by side.

For each group, the ranks' newest operations are lined up by sequence number: the members blocked in
seq k are waiting for the member whose newest entry is below k — that one is behind, and its own error
(or the traceback it was stopped in) says what it was doing instead.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from workbench.analysis.recovery import recoveries
from workbench.comm import torch_flight_recorder
from workbench.comm.flight_recorder import lagging
from workbench.measure.gpu_health import HARMFUL


def _errors(run_dir: str) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(run_dir, "error_rank*.json")):
        m = re.search(r"error_rank(\d+)", path)
        if m is None:  # the glob's * matched something other than a rank's number
            continue
        with open(path) as f:
            out[int(m.group(1))] = json.load(f)
    return out


def _describe(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "no operation yet"
    what = entry["op"] + (f" {entry['label']}" if entry.get("label") else "")
    return f"seq {entry['seq']} {what} (step {entry['step']}, {entry['state']})"


def behind(errors: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group: each member's newest operation, and the members behind the furthest one."""
    groups: dict[tuple[str, tuple[int, ...]], dict[int, dict[str, Any]]] = {}
    for rank, err in errors.items():
        for entry in err.get("last_collectives", []):
            key = (entry["group"], tuple(entry["group_ranks"] or ()))
            held = groups.setdefault(key, {}).get(rank)
            if held is None or (entry["seq"] or 0) >= (held["seq"] or 0):
                groups[key][rank] = entry
    report = []
    for (name, members), newest in sorted(groups.items()):
        if name == "world" or entry_op_is_p2p(newest):
            continue
        top, behind_ = lagging({r: e["seq"] or 0 for r, e in newest.items()}, members, errors)
        if behind_:
            report.append(
                {
                    "group": name,
                    "ranks": list(members),
                    "newest": {r: newest.get(r) for r in members},
                    "behind": behind_,
                    "blocked_at": top,
                }
            )
    return report


def entry_op_is_p2p(newest: dict[int, dict[str, Any]]) -> bool:
    return any(e["op"] in ("send", "recv") for e in newest.values())


def _last_frame(traceback: str) -> str:
    """Where the rank was: its traceback's innermost frame, above the signal handler that stopped it."""
    frames = [
        f
        for f in re.findall(r'File "([^"]+)", line (\d+), in (\S+)', traceback or "")
        if f[2] != "_on_sigterm"
    ]
    return f"{frames[-1][2]} ({os.path.basename(frames[-1][0])}:{frames[-1][1]})" if frames else "?"


def balance(run_dir: str) -> list[str]:
    """For a run that finished: is one rank behind the others? From summary.json's per-rank totals over
    the timed steps: each rank's own time (compute, plus time outside compute and communication — a
    straggler's sleep, a throttled device's stall) and its exposed communication (waiting in
    collectives). In a synchronous step the others wait for the slowest: the rank with the most own time
    is the straggler when the others' waiting is about its excess."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        ranks = json.load(f).get("ranks", [])
    timed = [r for r in ranks if r.get("step_time_s") and r.get("compute_s") is not None]
    if len(timed) < 2:
        return []
    with open(os.path.join(run_dir, "config.json")) as f:
        steps = max(1, json.load(f)["steps"] - timed[0].get("steps_excluded", 0))
    own = {r["rank"]: (r["compute_s"] + r["idle_s"]) / steps for r in timed}
    waits = {r["rank"]: r["exposed_comm_s"] / steps for r in timed}
    slow = max(own, key=own.__getitem__)
    others = [r for r in own if r != slow]
    excess = own[slow] - sorted(own[r] for r in others)[len(others) // 2]
    step_s = timed[0]["step_time_s"]
    lines = ["", "load balance (per step, over the timed steps):"]
    lines += [
        f"  rank {r}: own work and stalls {1e3 * own[r]:.1f} ms, waiting in collectives {1e3 * waits[r]:.1f} ms"
        for r in sorted(own)
    ]
    if excess > max(0.1 * step_s, 1e-3) and min(waits[r] for r in others) > waits[slow]:
        lines.append(
            f"straggler: rank {slow} — {1e3 * excess:.1f} ms per step more than the others, who wait "
            f"for it in their collectives ({1e3 * min(waits[r] for r in others):.1f} ms or more each)"
        )
    else:
        lines.append("no straggler: the ranks' own time is within 10 % of a step of each other")
    return lines


def _shortened(message: str, limit: int = 400) -> str:
    """The message whole if short, else cut at the last word boundary before `limit`, marked with …"""
    if len(message) <= limit:
        return message
    return message[:limit].rsplit(" ", 1)[0] + " …"


def diagnose(run_dir: str) -> str:
    errors = _errors(run_dir)
    if not errors:
        return "\n".join(
            [
                f"{run_dir}: no rank left an error file: the run did not fail (or died before it "
                f"could write one)"
            ]
            + recovery_view(run_dir)
            + balance(run_dir)
            + gpu_view(run_dir)
        )
    first = min(errors.values(), key=lambda e: (e.get("secondary", False), e.get("time", 0)))
    lines = [
        f"{run_dir}: {len(errors)} rank(s) failed; the first cause: rank {first['rank']}: "
        f"{first['type']}: {_shortened(first['message'])}",
        "",
    ]
    for rank, err in sorted(errors.items()):
        newest = err.get("last_collectives", [])[-1:] or [None]
        lines.append(
            f"  rank {rank}: {err['type']} at {_last_frame(err.get('traceback', ''))}; "
            f"newest collective: {_describe(newest[0])}"
        )
    for g in behind(errors):
        lines.append("")
        lines.append(
            f"group {g['group']} {g['ranks']}: blocked at seq {g['blocked_at']}; behind: "
            f"{', '.join(f'rank {r}' for r in g['behind'])}"
        )
        for r in g["ranks"]:
            lines.append(f"  rank {r}: {_describe(g['newest'].get(r))}")
        for r in g["behind"]:
            lines.append(
                f"  → rank {r} never reached seq {g['blocked_at']}: it was in "
                f"{_last_frame(errors[r].get('traceback', ''))} when it was stopped"
            )
    return "\n".join(lines + torch_view(run_dir) + recovery_view(run_dir) + gpu_view(run_dir))


def recovery_view(run_dir: str) -> list[str]:
    """The nodes the run lost and recovered from (analysis/recovery.py): which, and each time from the
    loss — detected, re-formed, first step done."""
    try:
        found = recoveries(run_dir)
    except (
        OSError,
        ValueError,
        KeyError,
    ) as e:  # a truncated trace must not hide the failure it explains
        return ["", f"node losses: unreadable ({type(e).__name__}: {e})"]
    if not found:
        return []
    lines = ["", f"node losses the run recovered from ({len(found)}):"]
    for r in found:
        lines += ["  " + line for line in r.describe().splitlines()]
    return lines


def gpu_view(run_dir: str) -> list[str]:
    """What each rank's GPU reported through NVML (gpu_health.jsonl: measure/gpu_health.py): its hottest
    and slowest sample, the harmful throttling, ECC errors and Xid events seen, and the anomalies."""
    path = os.path.join(run_dir, "gpu_health.jsonl")
    if not os.path.exists(path):
        return []
    by_rank: dict[int, list[dict[str, Any]]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                s = json.loads(line)
                by_rank.setdefault(s["rank"], []).append(s)
    lines = [
        "",
        f"GPU health (NVML, {sum(map(len, by_rank.values()))} sample(s) in gpu_health.jsonl):",
    ]
    for rank, samples in sorted(by_rank.items()):

        def most(key: str, pick: Any = max, samples: list[dict[str, Any]] = samples) -> Any:
            values = [s[key] for s in samples if s.get(key) is not None]
            return pick(values) if values else "n/a"

        throttled = sorted({r for s in samples for r in s.get("throttle", []) if r in HARMFUL})
        xids = sorted({x for s in samples for x in s.get("xid", [])})
        lines.append(
            f"  rank {rank}: up to {most('temperature_c')} °C, {most('power_w')} W, SM clock down to "
            f"{most('sm_clock_mhz', min)} MHz; throttled: {', '.join(throttled) or 'no'}; uncorrected "
            f"ECC: {most('ecc_uncorrected')}; Xid: {', '.join(map(str, xids)) or 'none'}"
        )
        for s in [s for s in samples if s.get("anomaly")][:3]:
            lines.append(f"    step {s['step']}: {s['anomaly']}")
    return lines


def torch_view(run_dir: str) -> list[str]:
    """What torch's flight recorder dumps say: per process group, who is behind."""
    dumps = torch_flight_recorder.read_dumps(run_dir)
    if not dumps:
        return []
    lines = [
        "",
        f"torch's flight recorder ({len(dumps)} dump(s), {torch_flight_recorder.PREFIX}<rank>):",
    ]
    stuck = torch_flight_recorder.behind(dumps)
    if not stuck:
        lines.append("  every group's members reached the same collective")
    for g in stuck:
        lines.append(
            f"  group {g['group']}: blocked at seq {g['blocked_at']}; behind: "
            f"{', '.join(f'rank {r}' for r in g['behind'])}"
        )
        for r, entry in sorted(g["newest"].items()):
            lines.append(f"    rank {r}: {torch_flight_recorder.describe(entry)}")
    return lines
