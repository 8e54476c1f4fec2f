"""summary.json: figures derived from a run's traces, beside the formulas' predictions.

Per rank (all times are totals over the run's optimizer steps):
- `step_time_s`: median `ProfilerStep#` span.
- `compute_s`: time covered by forward / backward / recompute / optimizer spans.
- `comm_s`: time covered by communication in flight (blocking collectives, and async ones from launch
  to completion); `overlap_s`: the part of it hidden under compute; `exposed_comm_s` the rest.
- `idle_s`: step time covered by neither (waiting on peers, Python overhead).
- `peak_bytes` / `predicted_bytes`: per memory category, the highest counter value and the formula.
- `comm_bytes`: bytes by op and group (S as nccl-tests counts it), in total and per step.

No torch here: it runs in the rank that writes the summary, in the launcher after a failure, and in
any notebook.
"""

from __future__ import annotations

import statistics
from typing import Any

from workbench import formulas
from workbench.config import ModelConfig
from workbench.pipeline.schedule import Schedule, build_schedule, simulate
from workbench.trace.recorder import LANES

COMPUTE_CATS = {"forward", "backward", "recompute", "optimizer"}


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def intersection_length(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    xs, ys = _merge(xs), _merge(ys)
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def comm_intervals(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float, float]]:
    """(args, start_us, end_us) of every communication operation, counted once each: blocking
    collectives and p2p from their span, async ones from their begin/end pair."""
    out = []
    opened: dict[Any, dict[str, Any]] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "X" and e.get("tid") == LANES["comm"] and not e.get("args", {}).get("async"):
            out.append((e["args"], e["ts"], e["ts"] + e["dur"]))
        elif ph == "b":
            opened[(e["name"], str(e["id2"]))] = e
        elif ph == "e":
            b = opened.pop((e["name"], str(e["id2"])), None)
            if b is not None:
                out.append((b["args"], b["ts"], e["ts"]))
    return out


def moved_bytes(args: dict[str, Any]) -> float:
    """Bytes this rank sends for one operation (ring algorithms): S·2(n−1)/n for all-reduce,
    S·(n−1)/n for all-gather and reduce-scatter, S for send; nothing for a receive."""
    n = len(args.get("group_ranks", ())) or 1
    s = float(args.get("bytes", 0))
    op = args.get("op")
    if op == "all_reduce":
        return s * 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return s * (n - 1) / n
    if op in ("send", "broadcast"):
        return s
    return 0.0


def rank_summary(trace: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    events = trace["traceEvents"]
    info = trace["workbench"]
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e["cat"] == "step"]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in spans
               if e["cat"] in COMPUTE_CATS and e["tid"] == LANES["compute"]]
    comms = comm_intervals(events)
    comm_iv = [(a, b) for _, a, b in comms]
    step_iv = [(e["ts"], e["ts"] + e["dur"]) for e in steps]
    total = sum(b - a for a, b in step_iv)
    compute_us, comm_us = union_length(compute), union_length(comm_iv)
    overlap_us = intersection_length(compute, comm_iv)
    busy_us = compute_us + comm_us - overlap_us

    comm_bytes: dict[str, dict[str, int]] = {}
    for args, _, _ in comms:
        by_group = comm_bytes.setdefault(args["op"], {})
        by_group[args["group"]] = by_group.get(args["group"], 0) + int(args.get("bytes", 0))
    n_steps = max(len(steps), 1)

    peaks: dict[str, int] = {}
    peak_total = 0
    for e in events:
        if e.get("ph") == "C" and e["name"] == "memory":
            for k, v in e["args"].items():
                peaks[k] = max(peaks.get(k, 0), int(v))
            peak_total = max(peak_total, int(sum(e["args"].values())))
    allocator: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "C" and e["name"] == "allocator":
            for k, v in e["args"].items():
                allocator[k] = max(allocator.get(k, 0), int(v))

    out = {
        "rank": trace["distributedInfo"]["rank"],
        "dp": info["dp"], "tp": info["tp"], "pp": info["pp"],
        "steps": len(steps),
        "step_time_s": statistics.median(e["dur"] for e in steps) / 1e6 if steps else None,
        "total_step_s": total / 1e6,
        "compute_s": compute_us / 1e6,
        "comm_s": comm_us / 1e6,
        "overlap_s": overlap_us / 1e6,
        "exposed_comm_s": (comm_us - overlap_us) / 1e6,
        "idle_s": max(total - busy_us, 0.0) / 1e6,
        "peak_bytes": peaks,
        "peak_total_bytes": peak_total,
        "predicted_bytes": predicted_bytes(config, info["pp"]),
        "predicted_comm_bytes_per_step": predicted_comm_bytes(config, info["pp"]),
        "comm_bytes": comm_bytes,
        "comm_bytes_per_step": {op: {g: b / n_steps for g, b in d.items()} for op, d in comm_bytes.items()},
        "bytes_moved_per_step": sum(moved_bytes(a) for a, _, _ in comms) / n_steps,
        "grad_sync_bytes_per_step": sum(
            int(a.get("bytes", 0)) for a, _, _ in comms
            if str(a.get("label", "")).startswith(("bucket", "param"))) / n_steps,
    }
    if allocator:
        out["allocator_peak_bytes"] = allocator
    return out


def predicted_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, float]:
    """The formulas' memory per rank for this run, by category."""
    model = _model(config)
    precision = config.get("precision", "fp32")
    tp, sp = config.get("tp", 1), config.get("sequence_parallel", False)
    params = formulas.params_per_rank(model, tp, config.get("pp", 1), config.get("virtual_stages", 1), pp_rank)
    states = formulas.model_state_bytes(params, config["dp"], config.get("zero", 0), precision)
    m = config.get("microbatches", 1)
    micro = config["global_batch"] // config["dp"] // m
    width = 4 if precision == "fp32" else 2
    rc = config.get("recompute", "none")
    if config.get("pp", 1) == 1 and m == 1:
        return {**states, "activation": formulas.activation_bytes(model, micro, width, tp, sp, rc)}
    # pipelined: walk this rank's schedule, adding a microbatch's stage bytes at each forward and
    # releasing them at its backward; the peak is what the schedule makes the rank hold at once
    sched = _schedule(config)
    stage_bytes = {k: formulas.stage_activation_bytes(model, micro, k, sched.stages, width, tp, sp, rc)
                   for k in range(sched.stages)}
    live = peak = 0.0
    for a in sched.actions[pp_rank]:
        if a.kind in ("F", "B"):
            live += stage_bytes[a.stage] if a.kind == "F" else -stage_bytes[a.stage]
            peak = max(peak, live)
    # with recomputation, one block's rerun sits on top during some backward (an upper bound here)
    transient = formulas.recompute_activation_bytes(model, micro, width, tp, sp, rc)[1]
    return {**states, "activation": peak + transient}


def _schedule(config: dict[str, Any]) -> Schedule:
    pp = config.get("pp", 1)
    return build_schedule(config.get("schedule", "1f1b") if pp > 1 else "1f1b", pp, config.get("microbatches", 1),
                          config.get("virtual_stages", 1))


def bubble(config: dict[str, Any], traces: list[dict[str, Any]]) -> dict[str, Any]:
    """The pipeline bubble: measured (per step, 1 − a rank's forward+backward time / the span from the
    first to the last compute action on any rank, averaged over ranks; the median over steps after the
    first), the formula (p − 1)/(v·m + p − 1), and the simulated schedule with the measured mean
    forward and backward times."""
    per_step: dict[int, dict[int, list[tuple[float, float]]]] = {}
    f_times, b_times = [], []
    for t in traces:
        rank = t["distributedInfo"]["rank"]
        for e in t["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") in ("forward", "backward") and e.get("tid") == LANES["compute"]:
                step = e["args"].get("step", 0)
                per_step.setdefault(step, {}).setdefault(rank, []).append((e["ts"], e["ts"] + e["dur"]))
                (f_times if e["cat"] == "forward" else b_times).append(e["dur"])
    fractions = []
    for step, ranks in sorted(per_step.items()):
        if step == 0 and len(per_step) > 1:
            continue  # the first step pays one-off costs (allocations, connections)
        start = min(a for iv in ranks.values() for a, _ in iv)
        end = max(b for iv in ranks.values() for _, b in iv)
        fractions.append(statistics.mean(1 - sum(b - a for a, b in iv) / (end - start) for iv in ranks.values()))
    sched = _schedule(config)
    simulated = None
    if f_times and b_times:
        simulated = simulate(sched, statistics.mean(f_times) * sched.v, statistics.mean(b_times) * sched.v)
    return {"measured": statistics.median(fractions) if fractions else None,
            "measured_per_step": fractions,
            "predicted": formulas.bubble_fraction(sched.p, sched.m, sched.v),
            "simulated_with_measured_costs": simulated.bubble_fraction() if simulated else None}


def predicted_comm_bytes(config: dict[str, Any], pp_rank: int = 0) -> dict[str, dict[str, float]]:
    """Bytes per step by op and group: the gradient all-reduce over dp (4 bytes per local parameter when
    dp > 1) and the loss's one value; the tensor-parallel collectives of the layers; and for pipelines
    the activations and gradients sent between stages (one b·s·h buffer per microbatch and boundary),
    the loss brought to every stage and the gradient norm's share."""
    model = _model(config)
    dp, tp, pp = config["dp"], config.get("tp", 1), config.get("pp", 1)
    v, m, sp = config.get("virtual_stages", 1), config.get("microbatches", 1), config.get("sequence_parallel", False)
    local = formulas.params_per_rank(model, tp, pp, v, pp_rank)
    zero = config.get("zero", 0)
    if zero and dp > 1:  # gradients reduce-scattered, parameters all-gathered (twice for ZeRO-3)
        out: dict[str, dict[str, float]] = {"all_reduce": {"dp": 4 + 4}, "reduce_scatter": {"dp": 4 * local},
                                            "all_gather": {"dp": 4 * local * (2 if zero == 3 else 1)}}
    else:
        grad_width = 4 if config.get("precision", "fp32") == "fp32" else 2  # gradients in the model's precision
        out = {"all_reduce": {"dp": 4 + (grad_width * local if dp > 1 else 0)}}
    micro = config["global_batch"] // dp // m
    stages = pp * v
    mine = list(range(pp_rank, stages, pp))
    layers = model.layers // stages * len(mine)
    tp_bytes = formulas.tp_comm_bytes_per_step(model, micro, tp, sp, m, layers, 0 in mine, stages - 1 in mine,
                                               4 if config.get("precision", "fp32") == "fp32" else 2,
                                               config.get("recompute", "none"))
    for op, nbytes in tp_bytes.items():
        out.setdefault(op, {})["tp"] = nbytes
    if config.get("precision") == "fp16" and not zero:  # the overflow check: one flag, max over the world
        out["all_reduce"]["world"] = 4
    if pp > 1:
        width = 4 if config.get("precision", "fp32") == "fp32" else 2
        buffer = micro * model.seq_len // (tp if sp else 1) * model.hidden * width
        transfers = sum((k < stages - 1) + (k > 0) for k in mine) * m * buffer  # each way, per step
        out["send"] = {"pp": transfers}
        out["recv"] = {"pp": transfers}
        out["all_reduce"]["pp"] = 4 + 4  # the loss, and the gradient norm's squares
    return out


def _model(config: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**{k: config["model"][k] for k in
                          ("vocab_size", "seq_len", "hidden", "heads", "layers", "mlp_ratio")})


def build_summary(config: dict[str, Any], traces: list[dict[str, Any]], status: str = "ok") -> dict[str, Any]:
    ranks = [rank_summary(t, config) for t in sorted(traces, key=lambda t: t["distributedInfo"]["rank"])]
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
        "predicted_ring_bytes_sent_per_step": formulas.dp_bytes_per_step(params_local, dp, config.get("zero", 0)),
        "ranks": ranks,
    }
    if config.get("pp", 1) > 1:
        out["bubble_fraction"] = bubble(config, traces)
    return out
