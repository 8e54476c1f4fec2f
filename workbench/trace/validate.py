"""Check traces against the run format (docs/run-format.md). Returns a list of problems; empty = valid.

    validate_trace(trace_dict)  one rank's file: keys and their order, metadata, lanes, event fields,
                                span nesting per lane, required args of collectives, memory counters
    validate_run(run_dir)       every rank's file, the merged file, and the cross-rank links: each
                                flow has both ends, each collective's seq agrees across its group

No torch: the tests, the CLI (`workbench validate DIR`) and CI all call it.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from workbench.trace.merge import load_traces
from workbench.trace.recorder import CATEGORIES, LANES
from workbench.trace.recorder import MEMORY_CATEGORIES as _MEMORY_CATEGORIES

TOP_KEYS = ["schemaVersion", "distributedInfo", "displayTimeUnit", "workbench", "traceEvents"]
MEMORY_CATEGORIES = set(_MEMORY_CATEGORIES)
COLLECTIVE_ARGS = ("op", "group", "seq", "bytes")
EPS_US = 0.01  # timestamps are rounded to the nanosecond: allow that much at span edges


def validate_trace(trace: dict[str, Any]) -> list[str]:
    errors = _check_header(trace)
    if errors and errors[0].startswith("top-level keys"):
        return errors
    merged = bool(trace["workbench"].get("merged"))
    events = trace["traceEvents"]
    rank = trace["distributedInfo"].get("rank")
    seen = _Seen()
    for i, e in enumerate(events):
        where = f"event {i} ({e.get('ph')} {e.get('name')!r})"
        if "pid" not in e or (not merged and e["pid"] != rank):
            errors.append(f"{where}: pid {e.get('pid')} is not the rank {rank}")
        elif e.get("ph") == "M":
            seen.names[e["pid"]].add(
                e["name"] if e["name"] != "thread_name" else f"thread:{e['args']['name']}"
            )
        elif not isinstance(e.get("ts"), (int, float)):
            errors.append(f"{where}: no numeric ts")
        else:
            errors += _check_event(e, where, seen)
    for key, n in seen.async_open.items():
        if n != 0:
            errors.append(f"async events {key} are not paired (begin − end = {n})")
    for (pid, tid), lane_spans in seen.spans.items():
        errors += _check_nesting(pid, tid, lane_spans)
    for pid in {e["pid"] for e in events if "pid" in e}:
        want = {"process_name", "process_sort_index", "thread_sort_index"} | {
            f"thread:{n}" for n in LANES
        }
        if not want <= seen.names[pid]:
            errors.append(f"pid {pid}: metadata lacks {sorted(want - seen.names[pid])}")
    if seen.steps == 0 and not trace["workbench"].get("recovered"):
        errors.append("no ProfilerStep# span")
    return errors


@dataclass(kw_only=True)
class _Seen:
    """What the walk over one file's events collects for the checks that need all of them."""

    names: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    spans: dict[tuple[int, int], list[tuple[float, float, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    async_open: Counter = field(default_factory=Counter)
    steps: int = 0


def _check_header(trace: dict[str, Any]) -> list[str]:
    if list(trace)[: len(TOP_KEYS)] != TOP_KEYS:
        return [f"top-level keys {list(trace)} do not start with {TOP_KEYS} in that order"]
    errors = []
    if not isinstance(trace["schemaVersion"], int):
        errors.append("schemaVersion is not an integer")
    errors += [
        f"distributedInfo lacks {key!r}"
        for key in ("backend", "rank", "world_size")
        if key not in trace["distributedInfo"]
    ]
    if trace["displayTimeUnit"] != "ms":
        errors.append("displayTimeUnit is not 'ms'")
    if not trace["workbench"].get("merged"):
        errors += [
            f"workbench block lacks {key!r}"
            for key in ("run", "dp", "tp", "pp", "clock_offset_us")
            if key not in trace["workbench"]
        ]
    return errors


def _check_event(e: dict[str, Any], where: str, seen: _Seen) -> list[str]:
    ph = e.get("ph")
    if ph == "X":
        return _check_span(e, where, seen)
    errors = []
    if ph in ("b", "e"):
        if "id2" not in e and "id" not in e:
            errors.append(f"{where}: async event without id2")
        key = (e["pid"], e["name"], json.dumps(e.get("id2", e.get("id")), sort_keys=True))
        seen.async_open[key] += 1 if ph == "b" else -1
        if ph == "b" and e.get("cat") in ("collective", "p2p"):
            errors += _collective_args(e.get("args", {}), where)
    elif ph == "C":
        got = set(e.get("args", {}))
        if e["name"] == "memory" and got != MEMORY_CATEGORIES:
            errors.append(
                f"{where}: memory categories {sorted(got)} != {sorted(MEMORY_CATEGORIES)}"
            )
    elif ph in ("s", "f"):
        if "id" not in e:
            errors.append(f"{where}: flow without id")
        if ph == "f" and e.get("bp") != "e":
            errors.append(f"{where}: flow end without bp='e'")
    else:
        errors.append(f"{where}: unknown phase {ph!r}")
    return errors


def _check_span(e: dict[str, Any], where: str, seen: _Seen) -> list[str]:
    errors = []
    if e.get("cat") not in CATEGORIES:
        errors.append(f"{where}: cat {e.get('cat')!r} is not one of {CATEGORIES}")
    if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
        return errors + [f"{where}: bad dur {e.get('dur')!r}"]
    if e.get("tid") not in LANES.values():
        errors.append(f"{where}: tid {e.get('tid')} is not a lane")
    args = e.get("args", {})
    if "rank" in args:
        errors.append(f"{where}: args use a bare 'rank' key (use 'peer')")
    if e["cat"] in ("collective", "p2p"):
        errors += _collective_args(args, where)
    if e["cat"] == "step":
        seen.steps += 1
        if not e["name"].startswith("ProfilerStep#"):
            errors.append(f"{where}: a step span must be named ProfilerStep#<n>")
    seen.spans[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    return errors


def _collective_args(args: dict[str, Any], where: str) -> list[str]:
    missing = [k for k in COLLECTIVE_ARGS if k not in args]
    return [f"{where}: collective args lack {missing}"] if missing else []


def _check_nesting(pid: int, tid: int, spans: list[tuple[float, float, str]]) -> list[str]:
    """Spans on one lane must nest: each one either inside the enclosing one or after it."""
    errors = []
    stack: list[tuple[float, float, str]] = []
    for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and start >= stack[-1][1] - EPS_US:
            stack.pop()
        if stack and end > stack[-1][1] + EPS_US:
            errors.append(
                f"pid {pid} tid {tid}: span {name!r} [{start}, {end}] overlaps "
                f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}] without nesting"
            )
            if len(errors) > 5:
                break
        stack.append((start, end, name))
    return errors


def validate_run(run_dir: str) -> list[str]:
    errors: list[str] = []
    traces = load_traces(run_dir)
    if not traces:
        return [f"{run_dir}: no trace_rank*.json"]
    for t in traces:
        errors += [f"rank {t['distributedInfo']['rank']}: {m}" for m in validate_trace(t)]
    merged_path = os.path.join(run_dir, "trace.json")
    if os.path.exists(merged_path):
        with open(merged_path) as f:
            errors += [f"trace.json: {m}" for m in validate_trace(json.load(f))]
    else:
        errors.append("no merged trace.json")
    flows: dict[int, Counter] = defaultdict(Counter)
    seqs: dict[tuple, set] = defaultdict(set)
    for t in traces:
        for e in t["traceEvents"]:
            if e.get("ph") in ("s", "f"):
                flows[e["id"]][e["ph"]] += 1
            args = e.get("args", {})
            if e.get("cat") == "collective" and e.get("ph") in ("X", "b") and not args.get("async"):
                key = (args.get("group"), tuple(args.get("group_ranks", ())), args.get("seq"))
                # a variable all-to-all (expert parallelism's dropless dispatch) sends what each rank has
                seqs[key].add(
                    (args.get("op"), None if "send_splits" in args else args.get("bytes"))
                )
    for fid, c in flows.items():
        if c["s"] != 1 or c["f"] != 1:
            errors.append(f"flow {fid}: {c['s']} start(s) and {c['f']} end(s); want one of each")
    for key, variants in seqs.items():
        if len(variants) > 1:
            errors.append(
                f"collective seq {key[2]} on group {key[0]} {list(key[1])} differs across ranks: {variants}"
            )
    return errors
