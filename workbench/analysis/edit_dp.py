"""What-if edit: the same run with another number of data-parallel replicas (analysis/what_if.py).
No torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.analysis.collective_fit import cost, fit, replica_group
from workbench.analysis.execution_graph import Graph, Item, OpNode
from workbench.analysis.scaling import compute_ratio
from workbench.config import ConfigError
from workbench.config.grid import RankGrid


def resize_dp(graph: Graph, dp: int, stretch: Any, hardware: Any, notes: list[str]) -> Graph:
    """The graph of the same run with `dp` data-parallel replicas (module docstring)."""
    c = graph.config
    if c.get("cp", 1) > 1 or c.get("ep", 1) > 1:
        raise ConfigError(
            "what-if dp: runs with context or expert parallelism are not edited (their groups span dp)"
        )
    if dp < 1 or c["global_batch"] % (dp * c["microbatches"]):
        raise ConfigError(
            f"dp={dp}: the global batch {c['global_batch']} must split into dp × microbatches "
            f"({c['microbatches']}) equal micro-batches"
        )
    old = RankGrid(dp=c["dp"], tp=c["tp"], pp=c["pp"])
    new = RankGrid(dp=dp, tp=c["tp"], pp=c["pp"])
    ratio = stretch(new.world_size) / stretch(old.world_size)
    tokens = c["dp"] / dp
    micro = c["global_batch"] // (c["dp"] * c["microbatches"])  # both split evenly (checked above)
    per_f, per_b = compute_ratio(c, hardware, micro, c["global_batch"] // (dp * c["microbatches"]))
    ab = fit([n for n in graph.ops.values() if replica_group(n)] or list(graph.ops.values()))
    notes.append(
        f"each rank's forward × {per_f:.2f} and backward × {per_b:.2f} ({tokens:.2f} of its tokens"
        f"{', its fixed cost kept' if per_f != tokens else ''}); every duration × "
        f"{ratio:.2f} ({new.world_size} ranks sharing the cores instead of {old.world_size}); "
        f"data-parallel α {ab[0]:.0f} µs a ring step, "
        f"β {1 / ab[1] if ab[1] else float('inf'):.1f} MB/s"
    )

    def source_of(r1: int) -> int:
        """The old rank whose program the new rank r1 copies: the same place in replica dp mod the old dp."""
        c1 = new.coords(r1)
        return old.rank(**{**c1, "dp": c1["dp"] % c["dp"]})

    def moved(m: int, replica: int) -> int:
        """Old rank m's place in the new grid's replica `replica`."""
        return new.rank(**{**old.coords(m), "dp": replica})

    programs: dict[int, list[Item]] = {}
    ops: dict[tuple[Any, ...], OpNode] = {}
    for r1 in range(new.world_size):
        c1 = new.coords(r1)

        def moved_extra(node: OpNode, c1: dict[str, int] = c1) -> dict[int, float]:
            """A replica's copy of what each member took beyond the cost, stretched."""
            return {moved(m, c1["dp"]): x * ratio for m, x in node.extra_us.items()}

        def remap(
            k: tuple[Any, ...], r1: int = r1, c1: dict[str, int] = c1
        ) -> tuple[Any, ...] | None:
            node = graph.ops.get(k)
            if node is None:
                return None
            key: tuple[Any, ...]
            if k[0] == "p2p":
                key = ("p2p", k[1], c1["dp"])
                if key not in ops:
                    members = tuple(sorted(moved(m, c1["dp"]) for m in node.members))
                    sender = moved(node.sender, c1["dp"]) if node.sender >= 0 else -1
                    ops[key] = dataclasses.replace(
                        node,
                        key=key,
                        members=members,
                        sender=sender,
                        cost_us=node.cost_us * ratio,
                        extra_us=moved_extra(node),
                    )
                return key
            axis = "dp" if replica_group(node) else node.group
            members = (
                tuple(range(new.world_size))
                if axis == "world"
                else tuple(new.group_ranks(axis, r1))
            )
            if len(members) == 1:
                return None  # one replica: nothing to reduce
            key = ("c", node.group, members, k[3])
            if key not in ops:
                dp_op = axis == "dp"
                seconds = (
                    cost(node.op, len(members), node.nbytes, ab) * ratio
                    if dp_op
                    else node.cost_us * ratio
                )
                ops[key] = dataclasses.replace(
                    node,
                    key=key,
                    members=members,
                    cost_us=seconds,
                    queue=("queue", node.group, members),
                    extra_us={} if dp_op else moved_extra(node),
                )
            return key

        programs[r1] = _scaled(
            graph.programs[source_of(r1)], remap, (per_f, per_b, tokens), ratio, c.get("zero", 0)
        )
    source = {r: source_of(r) for r in programs}
    return Graph(
        programs=programs,
        ops=ops,
        start_us={r: graph.start_us[source[r]] for r in programs},
        measured_us={r: graph.measured_us[source[r]] for r in programs},
        lanes_us={r: graph.lanes_us[source[r]] for r in programs},
        config={**c, "dp": dp},
        slots=graph.slots,
    )


def _scaled(
    program: list[Item], remap: Any, scales: tuple[float, float, float], ratio: float, zero: int
) -> list[Item]:
    """A copy of a rank's program for the new grid: forward (and recompute) and backward scaled by
    `scales`' first two, ZeRO's optimizer by the third (its slice), everything by the stretch `ratio`; keys
    remapped (an operation of one rank dropped, and a block left with none)."""
    forward, backward, tokens = scales
    out = []
    for it in program:
        it = dataclasses.replace(it, meta=dict(it.meta))
        if it.kind == "busy":
            kind = it.meta.get("kind", "")
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
