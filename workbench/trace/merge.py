"""Merge the per-rank traces of a run into one file for Perfetto (`pid` = rank keeps them apart).

No torch: the launcher also calls this after a failed run, on whatever traces the ranks left.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from workbench.trace.recorder import SCHEMA_VERSION, recover_partial


def rank_trace_paths(run_dir: str) -> dict[int, str]:
    """rank -> trace_rank{r}.json in `run_dir`."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, "trace_rank*.json")):
        m = re.fullmatch(r"trace_rank(\d+)\.json", os.path.basename(path))
        if m:
            out[int(m.group(1))] = path
    return dict(sorted(out.items()))


def recover_partials(run_dir: str) -> list[int]:
    """Turn every rank's crash sidecar that has no final trace into trace_rank{r}.json; return ranks."""
    recovered = []
    for path in sorted(glob.glob(os.path.join(run_dir, "trace_rank*.partial.jsonl"))):
        m = re.search(r"trace_rank(\d+)\.partial", path)
        if m is None:  # the glob's * matched something other than a rank's number
            continue
        rank = int(m.group(1))
        final = os.path.join(run_dir, f"trace_rank{rank}.json")
        if os.path.exists(final):
            os.remove(path)
        elif stream_to_trace(path, final):
            recovered.append(rank)
    return recovered


def stream_to_trace(stream: str, final: str) -> bool:
    """Write the trace a rank's stream holds to `final` and drop the stream; False (both kept as they are) where the
    stream does not read whole."""
    try:
        trace = recover_partial(stream)
    except (OSError, ValueError, KeyError, IndexError):
        return False
    with open(final, "w") as f:
        json.dump(trace, f)
    os.remove(stream)
    return True


def merge_traces(traces: list[dict[str, Any]]) -> dict[str, Any]:
    traces = sorted(traces, key=lambda t: t["distributedInfo"]["rank"])
    first = traces[0]
    return {
        "schemaVersion": SCHEMA_VERSION,
        "distributedInfo": {
            "backend": first["distributedInfo"]["backend"],
            "rank": 0,
            "world_size": first["distributedInfo"]["world_size"],
        },
        "displayTimeUnit": "ms",
        "workbench": {
            "run": first["workbench"]["run"],
            "merged": True,
            "ranks": [t["workbench"] for t in traces],
        },
        "traceEvents": [e for t in traces for e in t["traceEvents"]],
    }


class DamagedTrace(ValueError):
    """A trace file that is not whole JSON: which file, where, and how to get a whole one back."""


def read_trace(path: str) -> dict[str, Any]:
    """One trace file (a rank's, or the merged trace.json), or DamagedTrace naming it."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedTrace(damage(path, data, e)) from None


def damage(path: str, data: bytes, e: ValueError) -> str:
    """What is wrong with the file and what to do about it."""
    pos = getattr(e, "pos", getattr(e, "start", 0))
    cut = not data.rstrip().endswith(b"}")  # a whole trace ends its object
    where = f"at byte {pos:,} of {len(data):,}" + (
        f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
    )
    why = (
        f"it ends at byte {len(data):,}, cut short (the process writing it was killed, or the disk filled)"
        if cut
        else f"not JSON there ({getattr(e, 'msg', e)})"
    )
    run_dir, name = os.path.split(os.path.abspath(path))
    if name == "trace.json":
        fix = (
            f"the per-rank traces it merges are still there: rebuild it with `workbench merge {run_dir}` "
            f"(or wb.load(...), which reads the per-rank files)"
        )
    elif os.path.exists(stream := os.path.join(run_dir, f"{name[:-5]}.partial.jsonl")):
        fix = f"`workbench merge {run_dir}` rebuilds it from its stream, {os.path.basename(stream)}"
    else:
        fix = (
            f"its stream ({os.path.basename(stream)}) is gone (removed once the rank's trace was written): this "
            f"rank's events are lost; the other ranks' files hold theirs"
        )
    return f"{path} is damaged {where}: {why}; {fix}"


def load_traces(run_dir: str) -> list[dict[str, Any]]:
    return [read_trace(path) for path in rank_trace_paths(run_dir).values()]


def damaged_traces(run_dir: str) -> list[str]:
    """What is wrong with each trace file of the run (the per-rank ones and trace.json): empty when all are whole."""
    paths = list(rank_trace_paths(run_dir).values()) + [
        p for p in [os.path.join(run_dir, "trace.json")] if os.path.exists(p)
    ]
    problems = []
    for path in paths:
        try:
            read_trace(path)
        except DamagedTrace as e:
            problems.append(str(e))
    return problems


def rebuild(run_dir: str) -> tuple[list[int], str | None]:
    """Every rank trace its stream can still give (`recover_partials`), then trace.json merged again from the
    per-rank files; returns the ranks recovered and the merged file's path."""
    rebuilt = []
    # a damaged rank file whose stream is still there
    for rank, path in rank_trace_paths(run_dir).items():
        stream = os.path.join(run_dir, f"trace_rank{rank}.partial.jsonl")
        if not os.path.exists(stream):
            continue
        try:
            read_trace(path)
        except DamagedTrace:
            if stream_to_trace(stream, path):  # replaced only by a stream that reads whole
                rebuilt.append(rank)
    recovered = sorted(rebuilt + recover_partials(run_dir))
    # a rank file still damaged stops it, named (DamagedTrace)
    return recovered, write_merged(run_dir)


def write_merged(run_dir: str) -> str | None:
    traces = load_traces(run_dir)
    if not traces:
        return None
    path = os.path.join(run_dir, "trace.json")
    with open(path, "w") as f:
        json.dump(merge_traces(traces), f)
    return path


def merge_attempts(attempts: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Every attempt of a restarted run on one timeline: each rank's events shifted by its attempt's
    wall-clock start (`epoch_unix_us`) against the first attempt's, an instant `restart <n>` where
    attempt n begins. Async ids get the attempt as a prefix; only the last attempt keeps its flows (the
    same step's transfers would otherwise join across attempts)."""
    epochs = [
        t["workbench"]["epoch_unix_us"]
        for traces in attempts
        for t in traces
        if "epoch_unix_us" in t["workbench"]
    ]
    base = min(epochs, default=0.0)
    events: list[dict[str, Any]] = []
    for n, traces in enumerate(attempts):
        last = n == len(attempts) - 1
        starts = []
        for t in traces:
            shift = t["workbench"].get("epoch_unix_us", base) - base
            starts.append(shift)
            for e in t["traceEvents"]:
                if not last and e.get("ph") in ("M", "s", "f"):
                    continue
                e = {**e, "ts": round(e["ts"] + shift, 3)} if "ts" in e else dict(e)
                if "id2" in e:
                    e["id2"] = {"local": f"a{n}:{e['id2']['local']}"}
                events.append(e)
        if n > 0:
            events.append(
                {
                    "ph": "i",
                    "s": "g",
                    "name": f"restart {n}",
                    "cat": "step",
                    "pid": 0,
                    "tid": 0,
                    "ts": round(min(starts), 3),
                    "args": {"attempt": n},
                }
            )
    merged = merge_traces(attempts[-1])
    merged["workbench"]["attempts"] = len(attempts)
    merged["traceEvents"] = events
    return merged
