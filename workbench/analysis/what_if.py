"""What if the run had been laid out differently? Edit its measured execution graph
(analysis/execution_graph.py) into the configuration asked about, and replay it (analysis/replay.py).

    wb.what_if("traces/dp2", dp=4)                          # twice the data-parallel ranks
    wb.what_if("traces/pp2", schedule="gpipe", microbatches=8)
    wb.what_if("traces/dp2", bucket_mb=0.05)
    wb.what_if("traces/dp2", emulate_link="inter=0.5,200", ranks_per_node=1)
    wb.what_if("traces/dp2", straggler=(1, 0.02))           # rank 1 sleeps 20 ms each step

Each edit keeps what was measured and changes only what the new configuration changes (Lumos, Liang et al.
MLSys 2025, edits its graph the same way):

- **dp** (the global batch kept): each rank's forward and backward scaled by its share of the tokens
  (compute per token kept; ZeRO's optimizer by its 1/N slice), the data-parallel collectives re-costed by
  α–β for the new group size (α per ring step and β fitted to the run's own data-parallel operations),
  replicas added or dropped. On a CPU whose cores the ranks share, every duration is stretched by the
  share of a core a rank gets (`Hardware.contention` from calibrate(), else ranks / cores).
- **microbatches, schedule, virtual_stages** (a pipeline run): the schedule re-laid by the simulator from
  the run's own mean forward and backward cost per stage (per micro-batch, scaled by its tokens; a split
  backward's I and W each half of B) and its measured transfer time; the step is the replayed one with
  the simulated pipeline span swapped for the new one.
- **bucket_mb**: the data-parallel gradient buckets re-cut, each issued when backward has produced its
  bytes (in proportion to the last backward's time) and costed by the fitted α–β.
- **emulate_link / ranks_per_node**: each operation's emulated time replaced by the new link's
  (comm/emulated_link.py's formulas): collectives' costs, sends' holds.
- **straggler** (rank, seconds): that rank sleeps so long at the start of every step.

No torch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis import bubble
from workbench.analysis.execution_graph import Graph, Item, OpNode, build
from workbench.analysis.replay import replay
from workbench.config import ConfigError
from workbench.config.grid import RankGrid
from workbench.config.links import parse_links
from workbench.schedules.build import Action, build_schedule, simulate
from workbench.trace.bandwidth import bus_factor
from workbench.trace.merge import load_traces

#: ring steps of a collective over n ranks: the α's it pays (comm/emulated_link.py counts them alike)
STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1, "all_gather": lambda n: n - 1,
         "all_to_all": lambda n: n - 1, "broadcast": lambda n: n - 1}
CHANGES = ("dp", "microbatches", "schedule", "virtual_stages", "bucket_mb", "emulate_link", "ranks_per_node",
           "straggler")


@dataclass
class WhatIf:
    """A what-if's answer (seconds), beside the source run's measured and replayed step."""

    changes: dict[str, Any]
    source_measured_s: float
    source_replayed_s: float
    predicted_s: float
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        edits = ", ".join(f"{k}={v}" for k, v in self.changes.items())
        return (f"what if {edits}: {self.predicted_s * 1e3:.1f} ms a step (the run measured "
                f"{self.source_measured_s * 1e3:.1f} ms, its replay {self.source_replayed_s * 1e3:.1f} ms)")


def what_if(run: Any, hardware: Any = None, cores: int | None = None, **changes: Any) -> WhatIf:
    """The source run (a Run or its directory) edited by `changes` (CHANGES) and replayed. `hardware`: a
    calibrated Hardware whose `contention` says how ranks share this machine's cores; `cores`: else the
    cores the ranks share (default: this machine's, on a CPU run)."""
    unknown = set(changes) - set(CHANGES)
    if unknown:
        raise ConfigError(f"what_if: unknown change(s) {sorted(unknown)}; valid: {', '.join(CHANGES)}")
    path = run if isinstance(run, str) else run.path
    config = _config(path)
    graph = build(load_traces(path), config)
    source = replay(graph)
    notes: list[str] = []
    if not changes:
        return WhatIf({}, source.measured_us / 1e6, source.step_us / 1e6, source.step_us / 1e6, notes)
    stretch = _stretch(config, hardware, cores)
    if "straggler" in changes:
        rank, seconds = changes["straggler"]
        _straggle(graph, int(rank), float(seconds))
    if "emulate_link" in changes or "ranks_per_node" in changes:
        _relink(graph, changes.get("emulate_link", config.get("emulate_link")),
                int(changes.get("ranks_per_node", config.get("ranks_per_node") or 0)))
    if "bucket_mb" in changes:
        overlap = config.get("device", "cpu") != "cpu" or config["world_size"] < (cores or os.cpu_count() or 1)
        _rebucket(graph, float(changes["bucket_mb"]), overlap, notes)
    if "dp" in changes and int(changes["dp"]) != config["dp"]:
        graph = _resize_dp(graph, int(changes["dp"]), stretch, hardware, notes)
    edited = replay(graph)
    predicted = edited.step_us
    pipeline = {k: changes[k] for k in ("microbatches", "schedule", "virtual_stages") if k in changes}
    if pipeline:
        predicted += _relay_pipeline(path, config, graph.config, pipeline, hardware, notes)
    return WhatIf(dict(changes), source.measured_us / 1e6, source.step_us / 1e6, predicted / 1e6, notes)


def _config(path: str) -> dict[str, Any]:
    import json

    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


# ---- the stretch of shared cores ----------------------------------------------------------------
def _stretch(config: dict[str, Any], hardware: Any, cores: int | None) -> Any:
    """world → the factor every duration of a rank takes with `world` ranks sharing the machine."""
    if config.get("device", "cpu") != "cpu":
        return lambda world: 1.0
    if hardware is not None and getattr(hardware, "contention", None):
        from workbench.predict.action_costs import contention

        return lambda world: contention(hardware, world)[0]
    n = cores or os.cpu_count() or 1
    return lambda world: max(1.0, world / n)


def _compute_ratio(config: dict[str, Any], hardware: Any, micro: float, micro_new: float) -> tuple[float, float]:
    """(forward, backward) time of one action at `micro_new` sequences over at `micro`: per token without a
    calibrated `hardware`; with one, its fixed cost per layer kept and the rest by its rates (a small
    micro-batch is mostly fixed cost: Python, launches)."""
    if hardware is None or not getattr(hardware, "layer_fwd_s", 0.0):
        return micro_new / micro, micro_new / micro
    from workbench.config import ModelConfig
    from workbench.predict.action_costs import Layout, _ctx, _layer

    keys = {f.name for f in dataclasses.fields(ModelConfig)}
    model = ModelConfig(**{k: v for k, v in config["model"].items() if k in keys})

    def layer(m: float) -> tuple[float, float]:
        L = Layout(model=model, tp=config["tp"], micro=m, sequence_parallel=config.get("sequence_parallel", False),
                   recompute=config.get("recompute", "none"), width=4 if config.get("precision") == "fp32" else 2)
        costs = _layer(L, hardware, _ctx(L, hardware))
        return (costs["compute"][0] + costs["overhead"][0], costs["compute"][1] + costs["overhead"][1])
    (f0, b0), (f1, b1) = layer(micro), layer(micro_new)
    return f1 / f0, b1 / b0


# ---- straggler and link -----------------------------------------------------------------------
def _straggle(graph: Graph, rank: int, seconds: float) -> None:
    if rank not in graph.programs:
        raise ConfigError(f"straggler rank {rank}: the run has ranks 0–{max(graph.programs)}")
    program = graph.programs[rank]
    for i in reversed(range(len(program))):
        it = program[i]
        if it.kind == "mark" and it.tag == "start":
            program.insert(i + 1, Item("busy", seconds * 1e6, tag="host", step=it.step, meta={"kind": "straggler"}))


def _relink(graph: Graph, spec: str | None, ranks_per_node: int) -> None:
    """Every operation's emulated time replaced by what the new links would hold it."""
    from workbench.comm.emulated_link import EmulatedNetwork

    if spec and ranks_per_node < 1:
        raise ConfigError("emulate_link needs ranks_per_node ≥ 1 (how many ranks an emulated machine holds)")
    net = EmulatedNetwork(parse_links(spec) if spec else {}, max(ranks_per_node, 1))
    for node in graph.ops.values():
        if node.op == "send":
            _, new = net.message_seconds(node.sender, next(m for m in node.members if m != node.sender) if
                                         len(set(node.members)) > 1 else node.sender, node.nbytes)
        else:
            _, new = net.collective_seconds(node.op, node.nbytes, list(node.members))
        # a collective's hold is inside its cost; a send's is the sender's, before it posts (its issue's)
        node.cost_us = max(0.0, node.cost_us + ((new if node.op != "send" else 0.0) - node.emulated_s) * 1e6)
        node.emulated_s = new
    for rank, program in graph.programs.items():
        for it in program:
            if it.kind == "busy" and it.meta.get("kind") == "emulated":
                it.us = 0.0  # a send's old hold: replaced by its issue's new one
            elif it.kind == "issue" and it.keys[0] in graph.ops and graph.ops[it.keys[0]].sender == rank:
                it.us = graph.ops[it.keys[0]].emulated_s * 1e6


# ---- α–β of a group's collectives ------------------------------------------------------------------
def _fit(nodes: list[OpNode]) -> tuple[float, float]:
    """(α µs per ring step, µs per byte sent) fitted by least squares to cost = steps(n)·α + bus(n)·bytes·c,
    each operation's cost its members' mean (the cost and what each took beyond it), the median of each
    (op, ranks, bytes) (one slow minute does not tilt the fit); clamped at 0; with one size only, all of
    the cost per ring step."""
    kinds: dict[tuple[str, int, int], list[float]] = {}
    for n in nodes:
        if n.op in STEPS and len(n.members) > 1:
            kinds.setdefault((n.op, len(n.members), n.nbytes), []).append(
                n.cost_us + sum(n.extra_us.values()) / len(n.members))
    rows = [(STEPS[op](k), bus_factor(op, k) * b, statistics.median(c)) for (op, k, b), c in kinds.items()]
    if not rows:
        return 0.0, 0.0
    sxx = sum(a * a for a, _, _ in rows)
    syy = sum(b * b for _, b, _ in rows)
    sxy = sum(a * b for a, b, _ in rows)
    det = sxx * syy - sxy * sxy
    if abs(det) <= 1e-9 * max(sxx * syy, 1e-30):
        return statistics.mean(c / a for a, _, c in rows), 0.0
    sxc = sum(a * c for a, _, c in rows)
    syc = sum(b * c for _, b, c in rows)
    alpha, per_byte = (syy * sxc - sxy * syc) / det, (sxx * syc - sxy * sxc) / det
    if alpha < 0:
        return 0.0, syc / syy
    if per_byte < 0:
        return sxc / sxx, 0.0
    return alpha, per_byte


def _cost(op: str, n: int, nbytes: float, fit: tuple[float, float]) -> float:
    return STEPS[op](n) * fit[0] + bus_factor(op, n) * nbytes * fit[1] if n > 1 else 0.0


def _replica_group(node: OpNode) -> bool:
    return node.group in ("dp", "dp_cp")


# ---- gradient buckets --------------------------------------------------------------------------------
def _rebucket(graph: Graph, bucket_mb: float, overlap: bool, notes: list[str]) -> None:
    """Each step's data-parallel buckets re-cut at `bucket_mb` (module docstring), each launched at the
    old buckets' mean launch cost. `overlap` False (a CPU whose cores the ranks fill: a collective's work
    needs the core backward holds): every bucket issued when backward ends, as one bucket was, and run one
    after another."""
    old = {k: n for k, n in graph.ops.items() if _replica_group(n) and n.op == "all_reduce"
           and n.label.startswith("bucket")}
    if not old:
        raise ConfigError("bucket_mb: the run has no data-parallel gradient buckets to re-cut (it needs dp > 1, "
                          "zero=0 and the bucketed data parallel)")
    fit = _fit([n for n in graph.ops.values() if _replica_group(n)])
    notes.append(f"data-parallel α {fit[0]:.0f} µs a ring step, {1 / fit[1] / 1e3 if fit[1] else float('inf'):.1f} "
                 f"MB/s (fitted to the run's own operations)")
    cap = bucket_mb * 2**20
    launches = [it.us for p in graph.programs.values() for it in p if _bucket_launch(it)]
    launch = statistics.mean(launches) if launches else 0.0
    if not overlap:  # and one collective at a time: the worker threads have no core of their own either
        notes.append("no overlap with backward, one bucket at a time: the ranks fill this machine's cores")
        graph.slots = 1
    for rank, program in graph.programs.items():
        graph.programs[rank] = [it for seg in _segments(program)
                                for it in _rebucket_step(seg, old, graph, fit, cap, launch, overlap)]
    for k in old:
        graph.ops.pop(k, None)


def _bucket_launch(it: Item) -> bool:
    return it.kind == "busy" and it.meta.get("kind") == "launch" and str(it.meta.get("label")).startswith("bucket")


def _segments(program: list[Item]) -> list[list[Item]]:
    """The program cut before each step's start mark (order kept)."""
    out: list[list[Item]] = [[]]
    for it in program:
        if it.kind == "mark" and it.tag == "start" and out[-1]:
            out.append([])
        out[-1].append(it)
    return out


def _rebucket_step(items: list[Item], old: dict[tuple[Any, ...], OpNode], graph: Graph,
                   fit: tuple[float, float], cap: float, launch: float, overlap: bool) -> list[Item]:
    mine = [old[it.keys[0]] for it in items if it.kind == "issue" and it.keys[0] in old]
    if not mine:
        return items
    total = sum(n.nbytes for n in mine)
    sizes = [min(cap, total - i * cap) for i in range(max(1, math.ceil(total / cap)))]
    first = mine[0]
    keys = [("c", first.group, first.members, ("bucket", first.step, i)) for i in range(len(sizes))]
    for i, (k, size) in enumerate(zip(keys, sizes, strict=True)):
        graph.ops[k] = dataclasses.replace(first, key=k, nbytes=int(size), label=f"bucket {i}", extra_us={},
                                           order=first.order + (i + 1) / (len(sizes) + 1),
                                           cost_us=_cost("all_reduce", len(first.members), size, fit))
    last_forward = max((i for i, it in enumerate(items) if it.meta.get("kind") == "forward"), default=-1)
    backward = [i for i, it in enumerate(items) if i > last_forward and it.meta.get("kind") == "backward"]
    span = sum(items[i].us for i in backward)
    # ready as backward produces them (or all at its end)
    at = [span * (sum(sizes[: i + 1]) / total if overlap else 1.0) for i in range(len(sizes))]
    out: list[Item] = []
    elapsed, nxt, placed_block = 0.0, 0, False
    for i, it in enumerate(items):
        if it.kind == "issue" and it.keys[0] in old or _bucket_launch(it):
            continue
        if it.kind == "block" and set(it.keys) <= set(old):
            if not placed_block:
                out.append(Item("block", it.us, tuple(keys), step=it.step, meta=dict(it.meta)))
                placed_block = True
            continue
        if i in backward:
            length = it.us
            while nxt < len(at) and at[nxt] <= elapsed + length + 1e-9:
                cut = max(0.0, at[nxt] - elapsed)
                out.append(dataclasses.replace(it, us=cut, meta=dict(it.meta)))
                out.append(Item("issue", keys=(keys[nxt],), step=it.step))
                out.append(Item("busy", launch, tag="launch", step=it.step, meta={"kind": "launch"}))
                elapsed, length, nxt = elapsed + cut, length - cut, nxt + 1
            out.append(dataclasses.replace(it, us=length, meta=dict(it.meta)))
            elapsed += length
            continue
        out.append(it)
    return out


# ---- data-parallel size ----------------------------------------------------------------------------
def _resize_dp(graph: Graph, dp: int, stretch: Any, hardware: Any, notes: list[str]) -> Graph:
    """The graph of the same run with `dp` data-parallel replicas (module docstring)."""
    c = graph.config
    if c.get("cp", 1) > 1 or c.get("ep", 1) > 1:
        raise ConfigError("what-if dp: runs with context or expert parallelism are not edited (their groups span dp)")
    if dp < 1 or c["global_batch"] % (dp * c["microbatches"]):
        raise ConfigError(f"dp={dp}: the global batch {c['global_batch']} must split into dp × microbatches "
                          f"({c['microbatches']}) equal micro-batches")
    old, new = RankGrid(c["dp"], c["tp"], c["pp"]), RankGrid(dp, c["tp"], c["pp"])
    ratio = stretch(new.world_size) / stretch(old.world_size)
    tokens = c["dp"] / dp
    micro = c["global_batch"] / c["dp"] / c["microbatches"]
    per_f, per_b = _compute_ratio(c, hardware, micro, micro * tokens)
    fit = _fit([n for n in graph.ops.values() if _replica_group(n)] or list(graph.ops.values()))
    notes.append(f"each rank's forward × {per_f:.2f} and backward × {per_b:.2f} ({tokens:.2f} of its tokens"
                 f"{', its fixed cost kept' if per_f != tokens else ''}); every duration × "
                 f"{ratio:.2f} ({new.world_size} ranks sharing the cores instead of {old.world_size}); "
                 f"data-parallel α {fit[0]:.0f} µs a ring step, "
                 f"β {1 / fit[1] / 1e3 if fit[1] else float('inf'):.1f} MB/s")
    programs: dict[int, list[Item]] = {}
    ops: dict[tuple[Any, ...], OpNode] = {}
    for r1 in range(new.world_size):
        c1 = new.coords(r1)
        r0 = old.rank(pp=c1["pp"], dp=c1["dp"] % c["dp"], tp=c1["tp"])

        def moved_extra(node: OpNode, c1: dict[str, int] = c1) -> dict[int, float]:
            """A replica's copy of what each member took beyond the cost, stretched."""
            return {new.rank(**{**old.coords(m), "dp": c1["dp"]}): x * ratio for m, x in node.extra_us.items()}

        def remap(k: tuple[Any, ...], r1: int = r1, c1: dict[str, int] = c1) -> tuple[Any, ...] | None:
            node = graph.ops.get(k)
            if node is None:
                return None
            if k[0] == "p2p":
                key = ("p2p", k[1], c1["dp"])
                if key not in ops:
                    moved = [new.rank(**{**old.coords(m), "dp": c1["dp"]}) for m in node.members]
                    sender = new.rank(**{**old.coords(node.sender), "dp": c1["dp"]}) if node.sender >= 0 else -1
                    ops[key] = dataclasses.replace(node, key=key, members=tuple(sorted(moved)), sender=sender,
                                                   cost_us=node.cost_us * ratio, extra_us=moved_extra(node))
                return key
            axis = "dp" if _replica_group(node) else node.group
            members = tuple(range(new.world_size)) if axis == "world" else tuple(new.group_ranks(axis, r1))
            if len(members) == 1:
                return None  # one replica: nothing to reduce
            key = ("c", node.group, members, k[3])
            if key not in ops:
                dp_op = axis == "dp"
                cost = _cost(node.op, len(members), node.nbytes, fit) * ratio if dp_op else node.cost_us * ratio
                ops[key] = dataclasses.replace(node, key=key, members=members, cost_us=cost,
                                               queue=("queue", node.group, members),
                                               extra_us={} if dp_op else moved_extra(node))
            return key
        programs[r1] = _scaled(graph.programs[r0], remap, (per_f, per_b, tokens), ratio, c.get("zero", 0))
    source = {r: old.rank(pp=new.coords(r)["pp"], dp=new.coords(r)["dp"] % c["dp"], tp=new.coords(r)["tp"])
              for r in programs}
    return Graph(programs, ops, {r: graph.start_us[source[r]] for r in programs},
                 {r: graph.measured_us[source[r]] for r in programs}, {r: graph.lanes_us[source[r]] for r in programs},
                 {**c, "dp": dp}, graph.slots)


def _scaled(program: list[Item], remap: Any, scales: tuple[float, float, float], ratio: float,
            zero: int) -> list[Item]:
    """A copy of a rank's program for the new grid: forward (and recompute) and backward scaled by
    `scales`' first two, ZeRO's optimizer by the third (its slice), everything by the stretch `ratio`; keys
    remapped (an operation of one rank dropped, and a block left with none)."""
    forward, backward, tokens = scales
    out = []
    for it in program:
        it = dataclasses.replace(it, meta=dict(it.meta))
        if it.kind == "busy":
            kind = it.meta.get("kind")
            scale = {"forward": forward, "recompute": forward, "backward": backward}.get(kind, 1.0)
            scale = tokens if kind == "optimizer" and zero else scale
            it.us *= scale * (ratio if kind != "straggler" else 1.0)
        elif it.kind in ("issue", "block"):
            keys = tuple(k for k in (remap(k) for k in it.keys) if k is not None)
            if not keys:
                continue
            it.keys = keys
            if it.kind == "block":
                it.us *= ratio
        out.append(it)
    return out


# ---- the pipeline re-laid ------------------------------------------------------------------------------
def _relay_pipeline(path: str, source: dict[str, Any], edited: dict[str, Any], changes: dict[str, Any],
                    hardware: Any, notes: list[str]) -> float:
    """µs the step gains (or loses) when its pipeline runs the new schedule: the simulated span of the new
    schedule less the old one's, both from the run's mean costs, transfer time and host gaps per action,
    the mean over the steps after the first and over the pipelines."""
    p, m, v = source["pp"], source["microbatches"], source["virtual_stages"]
    name = source["schedule"]
    if p == 1:
        raise ConfigError(f"{', '.join(changes)}: the schedule is re-laid only for a pipeline run (pp > 1); this "
                          "run has pp=1")
    m1, v1 = int(changes.get("microbatches", m)), int(changes.get("virtual_stages", v))
    name1 = changes.get("schedule", name)
    if name1 != "interleaved" and "virtual_stages" not in changes and name1 not in ("zbv",):
        v1 = 1 if name in ("interleaved", "zbv") else v1
    if name1 == "zbv":
        v1 = 2
    layers, batch = source["model"]["layers"], source["global_batch"]
    if layers % (p * v1) or batch % (edited["dp"] * m1):
        raise ConfigError(f"pp={p} × virtual_stages={v1} must divide the {layers} layers and dp × microbatches="
                          f"{edited['dp'] * m1} the global batch {batch}")
    old, new = build_schedule(name, p, m, v), build_schedule(name1, p, m1, v1)
    rule = "nccl" if source.get("backend") == "nccl" else "gloo"
    micro = batch / source["dp"] / m
    per_f, per_b = _compute_ratio(source, hardware, micro, batch / edited["dp"] / m1)
    deltas = []
    for replica in bubble.pipelines(load_traces(path), p):
        transfer = bubble.transfer_time(list(replica.values()))
        steps = bubble.step_inputs(old, replica)
        for step, inputs in sorted(steps.items())[1:] or sorted(steps.items()):
            per_rank = _rank_costs(inputs["cost"], p)
            chunk = v / v1  # a new action's share of its rank's layers
            cost = {}
            for s in range(p * v1):
                f, b = per_rank[s % p]
                f, b = f * per_f * chunk, b * per_b * chunk
                cost.update({(s, "F"): f, (s, "B"): b, (s, "I"): b / 2, (s, "W"): b / 2})
            gap = inputs["gap"]
            t = transfer.get(step, 0.0)
            deltas.append(_span(new, cost, gap, t, rule) - _span(old, inputs["cost"], gap, t, rule))
    if not deltas:
        raise ConfigError("the run has no complete pipeline step to re-lay")
    notes.append(f"pipeline re-laid: {name} m={m} v={v} → {name1} m={m1} v={v1} (simulated from the run's costs)")
    return statistics.mean(deltas)


def _rank_costs(cost: dict[tuple[int, str], float], p: int) -> dict[int, tuple[float, float]]:
    """Each pipeline rank's forward and backward (B, or I + W) of one micro-batch over all its stages."""
    out = {}
    for r in range(p):
        mine = [(s, k) for s, k in cost if s % p == r]
        f = sum(cost[(s, k)] for s, k in mine if k == "F")
        b = sum(cost[(s, k)] for s, k in mine if k in ("B", "I", "W"))
        out[r] = (f, b)
    return out


def _span(sched: Any, cost: dict[tuple[int, str], float], gap: dict[int, float], t_comm: float, rule: str) -> float:
    def f(r: int, item: Any) -> tuple[float, float]:
        if not isinstance(item, Action):
            return 0.0, 0.0
        busy = cost.get((item.stage, item.kind), 0.0)
        return busy + gap.get(r, 0.0), busy
    return simulate(sched, cost=f, t_comm=t_comm, rule=rule).makespan
