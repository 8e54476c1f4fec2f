"""What if the run had been laid out differently? Edit its measured execution graph
(analysis/execution_graph.py) into the configuration asked about, and replay it (analysis/replay.py).

    wb.what_if("traces/dp2", dp=4)                          # twice the data-parallel ranks
    wb.what_if("traces/pp2", schedule="gpipe", microbatches=8)
    wb.what_if("traces/pp2", schedule="dualpipev")              # a 1F1B trace re-laid as DeepSeek's V
    wb.what_if("traces/dp2", bucket_mb=0.05)
    wb.what_if("traces/dp2", emulate_link="inter=0.5,200", ranks_per_node=1)
    wb.what_if("traces/dp2", straggler=(1, 0.02))           # rank 1 sleeps 20 ms each step

Each edit keeps what was measured and changes only what the new configuration changes (Lumos, Liang et al.
MLSys 2025, edits its graph the same way):

- **dp** (the global batch kept; analysis/edit_dp.py): each rank's forward and backward scaled to its new
  micro-batch (per token, or with a calibrated `hardware` its fixed cost per layer kept: analysis/
  scaling.py; ZeRO's optimizer by its 1/N slice), the data-parallel collectives re-costed by α–β for the
  new group size (α per ring step and β fitted to the run's own data-parallel operations: analysis/
  collective_fit.py), replicas added or dropped. On a CPU whose cores the ranks share, every duration is
  stretched by the share of a core a rank gets (`Hardware.contention` from calibrate(), else processor
  sharing).
- **microbatches, schedule, virtual_stages** (a pipeline run; analysis/edit_pipeline.py): the schedule
  re-laid by the simulator from the run's own mean forward and backward cost per stage — each new stage
  what the run spent on the same layers: a V's (ZBV, DualPipeV) half-stages half a 1F1B stage, DualPipe's
  a whole one — scaled to the new micro-batch as above (a split backward's I and W each half of B), its
  measured transfer time and each rank's host time per send; the step is the replayed one
  with the simulated pipeline span swapped for the new one. (DualPipe's twin-gradient exchange and its
  optimizer over twice the parameters are not added: the note says so.)
- **bucket_mb** (analysis/edit_buckets.py): the data-parallel gradient buckets re-cut, each issued when
  backward has produced its bytes (in proportion to the last backward's time; on a CPU the ranks fill, all
  when backward ends, one at a time) and costed by the fitted α–β.
- **emulate_link / ranks_per_node**: each operation's emulated time replaced by the new link's
  (comm/emulated_link.py's formulas): collectives' costs, sends' holds.
- **straggler** (rank, seconds): that rank sleeps so long at the start of every step.

No torch.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.edit_buckets import rebucket
from workbench.analysis.edit_dp import resize_dp
from workbench.analysis.edit_pipeline import relay_pipeline
from workbench.analysis.execution_graph import Graph, Item, build
from workbench.analysis.intervals import step_spread
from workbench.analysis.replay import replay
from workbench.analysis.scaling import stretch
from workbench.config import ConfigError
from workbench.config.links import parse_links
from workbench.trace.merge import load_traces

CHANGES = (
    "dp",
    "microbatches",
    "schedule",
    "virtual_stages",
    "bucket_mb",
    "emulate_link",
    "ranks_per_node",
    "straggler",
)


@dataclass(kw_only=True)
class WhatIf:
    """A what-if's answer (seconds), beside the source run's measured and replayed step."""

    changes: dict[str, Any]
    source_measured_s: float
    source_replayed_s: float
    predicted_s: float
    notes: list[str] = field(default_factory=list)
    #: ± on predicted_s: the source run's own spread of its steps (analysis/intervals.step_spread), as a share
    spread: float = 0.0

    def __str__(self) -> str:
        edits = ", ".join(f"{k}={v}" for k, v in self.changes.items())
        return (
            f"what if {edits}: {self.predicted_s * 1e3:.1f} ± {self.predicted_s * self.spread * 1e3:.1f} ms a "
            f"step (the run measured "
            f"{self.source_measured_s * 1e3:.1f} ms, its replay {self.source_replayed_s * 1e3:.1f} ms)"
        )


def what_if(run: Any, hardware: Any = None, cores: int | None = None, **changes: Any) -> WhatIf:
    """The source run (a Run or its directory) edited by `changes` (CHANGES) and replayed. `hardware`: a
    calibrated Hardware whose `contention` says how ranks share this machine's cores; `cores`: else the
    cores the ranks share (default: this machine's, on a CPU run)."""
    unknown = set(changes) - set(CHANGES)
    if unknown:
        raise ConfigError(
            f"what_if: unknown change(s) {sorted(unknown)}; valid: {', '.join(CHANGES)}"
        )
    path = run if isinstance(run, str) else run.path
    config = _config(path)
    traces = load_traces(path)
    graph = build(traces, config)
    source = replay(graph)
    notes: list[str] = []
    steps = [statistics.mean(graph.measured_us[r][k] for r in graph.programs) for k in source.steps]
    spread = step_spread(steps)
    if not changes:
        return WhatIf(
            changes={},
            source_measured_s=source.measured_us / 1e6,
            source_replayed_s=source.step_us / 1e6,
            predicted_s=source.step_us / 1e6,
            notes=notes,
            spread=spread,
        )
    busy = statistics.mean(
        (lanes["compute"] + lanes["host"]) / source.per_rank_us[r]
        for r, lanes in source.lanes_us.items()
    )
    stretch_of = stretch(config, hardware, cores, busy)
    if "straggler" in changes:
        rank, seconds = changes["straggler"]
        _straggle(graph, int(rank), float(seconds))
    if "emulate_link" in changes or "ranks_per_node" in changes:
        _relink(
            graph,
            changes.get("emulate_link", config.get("emulate_link")),
            int(changes.get("ranks_per_node", config.get("ranks_per_node") or 0)),
            config.get("node_placement") or "block",
            config["world_size"],
        )
    if "bucket_mb" in changes:
        if not float(changes["bucket_mb"]) > 0:
            raise ConfigError(
                f"bucket_mb={changes['bucket_mb']}: a bucket holds more than 0 MB (default 25)"
            )
        overlap = config.get("device", "cpu") != "cpu" or config["world_size"] < (
            cores or os.cpu_count() or 1
        )
        rebucket(graph, float(changes["bucket_mb"]), overlap, notes)
    if "dp" in changes and int(changes["dp"]) != config["dp"]:
        graph = resize_dp(graph, int(changes["dp"]), stretch_of, hardware, notes)
    edited = replay(graph)
    predicted = edited.step_us
    pipeline: dict[str, Any] = {
        k: changes[k] for k in ("microbatches", "schedule", "virtual_stages") if k in changes
    }
    if pipeline:
        predicted += relay_pipeline(
            traces, config, graph.config, pipeline, hardware=hardware, notes=notes
        )
    return WhatIf(
        changes=dict(changes),
        source_measured_s=source.measured_us / 1e6,
        source_replayed_s=source.step_us / 1e6,
        predicted_s=predicted / 1e6,
        notes=notes,
        spread=spread,
    )


def _config(path: str) -> dict[str, Any]:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


# ---- straggler and link -----------------------------------------------------------------------
def _straggle(graph: Graph, rank: int, seconds: float) -> None:
    if rank not in graph.programs:
        raise ConfigError(f"straggler rank {rank}: the run has ranks 0–{max(graph.programs)}")
    program = graph.programs[rank]
    for i in reversed(range(len(program))):
        it = program[i]
        if it.kind == "mark" and it.tag == "start":
            program.insert(
                i + 1,
                Item(
                    kind="busy",
                    us=seconds * 1e6,
                    tag="host",
                    step=it.step,
                    meta={"kind": "straggler"},
                ),
            )


def _relink(
    graph: Graph, spec: str | None, ranks_per_node: int, placement: str = "block", world: int = 0
) -> None:
    """Every operation's emulated time replaced by what the new links would hold it (the machines take the run's
    ranks as the run placed them: `node_placement`)."""
    from workbench.comm.emulated_link import EmulatedNetwork

    if spec and ranks_per_node < 1:
        raise ConfigError(
            "emulate_link needs ranks_per_node ≥ 1 (how many ranks an emulated machine holds)"
        )
    if ranks_per_node > 1 and world % ranks_per_node:
        raise ConfigError(
            f"ranks_per_node={ranks_per_node}: the emulated machines must split the run's {world} "
            "ranks evenly"
        )
    net = EmulatedNetwork(
        links=parse_links(spec) if spec else {},
        ranks_per_node=max(ranks_per_node, 1),
        placement=placement,
        world_size=world,
    )
    for node in graph.ops.values():
        if node.op == "send":
            peer = next((m for m in node.members if m != node.sender), node.sender)
            _, new = net.message_seconds(node.sender, peer, node.nbytes)
        else:
            _, new = net.collective_seconds(node.op, node.nbytes, list(node.members))
        # a send's hold is the sender's, before it posts (its issue's); a blocking collective's comes after
        # it is done; an asynchronous one's runs beside it, and its wait returns no earlier than either
        own = max(0.0, node.cost_us - node.emulated_s * 1e6)
        if node.op == "send":
            node.cost_us = own
        elif node.blocking:
            node.cost_us = own + new * 1e6
        else:
            node.cost_us = max(own, new * 1e6)
        node.emulated_s = new
    for rank, program in graph.programs.items():
        for it in program:
            if it.kind == "busy" and it.meta.get("kind") == "emulated":
                it.us = 0.0  # a send's old hold: replaced by its issue's new one
            elif (
                it.kind == "issue"
                and it.keys[0] in graph.ops
                and graph.ops[it.keys[0]].sender == rank
            ):
                it.us = graph.ops[it.keys[0]].emulated_s * 1e6
