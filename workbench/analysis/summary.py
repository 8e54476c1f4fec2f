"""summary.json: figures measured from a run's traces, beside the formulas' predictions (which come
from predict/formulas/: this module only measures).

Per rank (all times are totals over the run's optimizer steps after the first `warmup_steps_excluded`,
default 1 — `steps_excluded` says how many were left out —; memory and bytes count every step):
- `step_time_s`: median `ProfilerStep#` span.
- `compute_s`: time covered by forward / backward / recompute / optimizer spans.
- `comm_s`: time covered by communication in flight (blocking collectives, and async ones from launch
  to completion); `overlap_s`: the part of it hidden under compute; `exposed_comm_s` the rest.
- `idle_s`: step time covered by neither (waiting on peers, Python overhead).
- `peak_bytes` / `predicted_bytes`: per memory category, the highest counter value and the formula.
- `comm_bytes`: bytes by op and group (S as nccl-tests counts it), in total and per step: each operation
  once (the host's launch spans, category `launch`, are not operations).
- ZeRO-Offload: `host_peak_bytes` / `predicted_host_bytes`, what the host holds for the optimizer.
- `data_s`: time spent making batches (the `data` lane) in those steps.

Measured and fast steps (measure/schedule.py): memory figures come from the measured steps only (a fast
step takes no snapshot); `step_time_s` is the median of the fast steps where there are any (the speed
nothing was measured in), else of the measured ones; `step_time_measured_s` / `step_time_fast_s` are
both, and `measure_cost` their ratio — what measuring costs a step. `figures_from` names the steps.
Run-wide: `mfu` on CUDA (formulas/flops.py: 6·N + 12·L·s·h FLOPs a token, over the device's dense peak
by its name, predict/hardware.py, or PEAK_TFLOPS).

No torch here: it runs in the rank that writes the summary, in the launcher after a failure, and in
any notebook.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from workbench.analysis.bubble import bubble
from workbench.predict import formulas
from workbench.predict.hardware import PEAK_ENV, peak_flops
from workbench.trace.bandwidth import bytes_sent
from workbench.trace.spans import (
    comm_intervals,
    compute_intervals,
    intersection_length,
    union_length,
)


def timed_steps(steps: list[dict[str, Any]], excluded: int) -> list[dict[str, Any]]:
    """The step spans the time figures count: all but the first `excluded` (warm-up: one rank starting
    later makes the others wait, allocators and caches fill), unless that would leave none."""
    ordered = sorted(steps, key=lambda e: e["ts"])
    return ordered[excluded:] if len(ordered) > excluded else ordered


def timed_step_figures(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """The median step time of the fast steps (or, where none ran fast, the measured ones), each kind's, the
    cost of measuring (measured ÷ fast) and which steps each comes from."""

    def median(xs: list[dict[str, Any]]) -> float | None:
        return statistics.median(e["dur"] for e in xs) / 1e6 if xs else None

    measured = [e for e in timed if e.get("args", {}).get("measured", True)]
    fast = [e for e in timed if not e.get("args", {}).get("measured", True)]
    m, f = median(measured), median(fast)
    return {
        "step_time_s": f if fast else m,
        "step_time_measured_s": m,
        "step_time_fast_s": f,
        "measure_cost": m / f if m and f else None,
        "step_time_from": "fast steps" if fast else "measured steps",
        "measured_steps": sorted(
            e["args"]["step"] for e in measured if "step" in e.get("args", {})
        ),
        "fast_steps": sorted(e["args"]["step"] for e in fast if "step" in e.get("args", {})),
    }


def rank_summary(trace: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    events = trace["traceEvents"]
    info = trace["workbench"]
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e["cat"] == "step"]
    timed = timed_steps(steps, int(config.get("warmup_steps_excluded", 0)))
    since = timed[0]["ts"] if timed else 0.0  # the time figures leave the warm-up steps out
    compute = compute_intervals(spans, since)
    data_us = union_length(
        [(e["ts"], e["ts"] + e["dur"]) for e in spans if e["cat"] == "data" and e["ts"] >= since]
    )
    comms = comm_intervals(events)
    comm_iv = [(a, b) for _, a, b in comms if a >= since]
    step_iv = [(e["ts"], e["ts"] + e["dur"]) for e in timed]
    total = sum(b - a for a, b in step_iv)
    compute_us, comm_us = union_length(compute), union_length(comm_iv)
    overlap_us = intersection_length(compute, comm_iv)
    busy_us = compute_us + comm_us - overlap_us

    comm_bytes: dict[str, dict[str, int]] = {}
    for args, _, _ in comms:
        by_group = comm_bytes.setdefault(args["op"], {})
        by_group[args["group"]] = by_group.get(args["group"], 0) + int(args.get("bytes", 0))
    n_steps = max(len(steps), 1)

    out = {
        "rank": trace["distributedInfo"]["rank"],
        "dp": info["dp"],
        "tp": info["tp"],
        "pp": info["pp"],
        "steps": len(steps),
        "steps_excluded": len(steps) - len(timed),
        **timed_step_figures(timed),
        "total_step_s": total / 1e6,
        "compute_s": compute_us / 1e6,
        "comm_s": comm_us / 1e6,
        "overlap_s": overlap_us / 1e6,
        "exposed_comm_s": (comm_us - overlap_us) / 1e6,
        "idle_s": max(total - busy_us, 0.0) / 1e6,
        "data_s": data_us / 1e6,
        **memory_figures(events),
        "predicted_bytes": formulas.predicted_bytes(config, info["pp"]),
        "predicted_peak_total_bytes": formulas.predicted_total(config, info["pp"])[1],
        **(
            {"predicted_host_bytes": host}
            if (host := formulas.predicted_host_bytes(config, info["pp"]))
            else {}
        ),
        "predicted_comm_bytes_per_step": formulas.predicted_comm_bytes(config, info["pp"]),
        "comm_bytes": comm_bytes,
        "comm_bytes_per_step": {
            op: {g: b / n_steps for g, b in d.items()} for op, d in comm_bytes.items()
        },
        "bytes_moved_per_step": sum(bytes_sent(a) for a, _, _ in comms) / n_steps,
        "grad_sync_bytes_per_step": sum(
            int(a.get("bytes", 0))
            for a, _, _ in comms
            if str(a.get("label", "")).startswith(("bucket", "param"))
        )
        / n_steps,
    }
    return out


def memory_figures(events: list[dict[str, Any]]) -> dict[str, Any]:
    """`peak_bytes` (each category's highest counter), `peak_total_bytes` (the highest sum of all
    categories at one snapshot: what the rank really pays), `bytes_at_peak_total` (each category at that
    snapshot: they sum to peak_total_bytes, where the peaks of `peak_bytes` need not coincide) and, where
    the allocator was read (CUDA, or CPU with --profile-memory), `allocator_peak_bytes`,
    `unattributed_bytes` (what the allocator held at its peak beyond the categories and, on CPU, beyond
    what the backend's own threads had allocated) and `attributed_share_min` (the smallest share of the
    allocator's bytes so explained at any snapshot). With the CPU's profile, `true_peak`: the most the allocator
    held at any moment of the profiled step (every allocation and free, not only the snapshots), the categories
    in effect then (the last snapshot before it) and what they leave `unattributed` there."""
    peaks: dict[str, int] = {}
    totals: dict[float, int] = {}
    at_peak: dict[str, int] = {}
    host: dict[str, int] = {}  # ZeRO-Offload's host side
    allocator: dict[str, int] = {}
    allocated: dict[float, int] = {}
    backend: dict[
        float, int
    ] = {}  # CPU profile: live bytes the communication backend's threads allocated
    true_peak: dict[str, Any] | None = None
    for e in events:
        if e.get("ph") == "C" and e["name"] == "allocator_peak":
            true_peak = {
                "allocated": int(e["args"]["allocated"]),
                "ts_us": e["ts"],
                "backend_threads": int(e["args"].get("backend_threads", 0)),
            }
        if e.get("ph") == "C" and e["name"] == "memory":
            for k, v in e["args"].items():
                peaks[k] = max(peaks.get(k, 0), int(v))
            totals[e["ts"]] = int(sum(e["args"].values()))
            if totals[e["ts"]] > sum(at_peak.values()) or not at_peak:
                at_peak = {k: int(v) for k, v in e["args"].items()}
        elif e.get("ph") == "C" and e["name"] == "host_memory":
            for k, v in e["args"].items():
                host[k] = max(host.get(k, 0), int(v))
        elif e.get("ph") == "C" and e["name"] == "allocator":
            for k, v in e["args"].items():
                allocator[k] = max(allocator.get(k, 0), int(v))
            allocated[e["ts"]] = int(e["args"]["allocated"])
            backend[e["ts"]] = int(e["args"].get("backend_threads", 0))
    out: dict[str, Any] = {
        "peak_bytes": peaks,
        "peak_total_bytes": max(totals.values(), default=0),
        "bytes_at_peak_total": at_peak,
    }
    if host:
        out["host_peak_bytes"] = host
    if allocator:
        out["allocator_peak_bytes"] = allocator
        matched = {
            ts: (a, totals[ts] + backend[ts])
            for ts, a in allocated.items()
            if ts in totals and a > 0
        }
        if matched:
            allocated_bytes, tracked_bytes = max(matched.values())
            out["unattributed_bytes"] = allocated_bytes - tracked_bytes
            out["attributed_share_min"] = min(t / a for a, t in matched.values())
    if true_peak is not None:
        out["true_peak"] = at_true_peak(events, true_peak)
    return out


def at_true_peak(events: list[dict[str, Any]], peak: dict[str, Any]) -> dict[str, Any]:
    """The categories of the last `memory` snapshot at or before the allocator's true peak, and the bytes they
    (and the backend's threads) leave unexplained there."""
    before = [
        e
        for e in events
        if e.get("ph") == "C" and e["name"] == "memory" and e["ts"] <= peak["ts_us"]
    ]
    categories = (
        {k: int(v) for k, v in max(before, key=lambda e: e["ts"])["args"].items()} if before else {}
    )
    return {
        **peak,
        "categories": categories,
        "unattributed": peak["allocated"] - sum(categories.values()) - peak["backend_threads"],
    }


def build_summary(
    config: dict[str, Any], traces: list[dict[str, Any]], status: str = "ok"
) -> dict[str, Any]:
    ranks = [
        rank_summary(t, config) for t in sorted(traces, key=lambda t: t["distributedInfo"]["rank"])
    ]
    step_times = [r["step_time_s"] for r in ranks if r["step_time_s"] is not None]
    params = config["params"]
    dp = config["dp"]
    params_local = config.get("params_per_rank", params)
    out = {
        "run": traces[0]["workbench"]["run"] if traces else None,
        "status": status,
        "world_size": config["world_size"],
        "ranks_reporting": [r["rank"] for r in ranks],
        "step_time_s": max(step_times) if step_times else None,
        "predicted_grad_sync_bytes_per_step": 4 * params_local if dp > 1 else 0,
        "predicted_ring_bytes_sent_per_step": formulas.dp_bytes_per_step(
            params_local, dp, config.get("zero", 0)
        ),
        "ranks": ranks,
    }
    if config.get("pp", 1) > 1:
        out["bubble_fraction"] = bubble(config, traces)
    if ranks:
        out["figures_from"] = {
            "step_time_s": f"{ranks[0]['step_time_from']} after the first "
            f"{ranks[0]['steps_excluded']} (median)",
            "memory": f"measured steps {ranks[0]['measured_steps'] or 'none'}",
        }
    if config.get("device") == "cuda" and out["step_time_s"]:
        out["mfu"] = model_utilisation(config, out["step_time_s"])
    return out


def model_utilisation(config: dict[str, Any], step_time_s: float) -> dict[str, Any]:
    """MFU of the run at its step time (the slowest rank's): the model's FLOPs a token × tokens/s over the
    devices' dense peak (their name, or PEAK_TFLOPS); `value` None where the device is unknown."""
    model = formulas.run_model(config)
    tokens_per_s = config["global_batch"] * model.seq_len / step_time_s
    peak = peak_flops(
        config.get("device_name", ""), config.get("precision", "fp32"), os.environ.get(PEAK_ENV)
    )
    return {
        "value": formulas.mfu(model, tokens_per_s, peak, config["world_size"]) if peak else None,
        "flops_per_token": formulas.model_flops_per_token(model),
        "tokens_per_s": tokens_per_s,
        "peak_flops": peak,
        "device_name": config.get("device_name"),
        "note": None if peak else f"unknown device {config.get('device_name')!r}: set {PEAK_ENV}",
    }
