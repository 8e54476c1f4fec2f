"""The rank grid: global rank ↔ (pp, dp, cp, tp) coordinates, and one process group per axis.

Layout (Megatron-LM's order, the brief's 3D picture): tensor parallel is the fastest-varying axis, so
the t ranks of a tensor-parallel group are neighbours (on one host they share the fastest links);
context parallel next (its ring passes K/V every layer: the next-fastest links); data parallel next;
pipeline parallel slowest::

    rank = pp_index · (dp · cp · tp) + dp_index · (cp · tp) + cp_index · tp + tp_index

With cp = 1 (every run without context parallelism) this is pp · (dp · tp) + dp · tp + tp.

With dp=2, tp=2, pp=2 (8 ranks)::

    pp stage 0:  dp 0 → ranks [0, 1]   dp 1 → ranks [2, 3]      (each bracket is one tp group)
    pp stage 1:  dp 0 → ranks [4, 5]   dp 1 → ranks [6, 7]
    dp groups: [0, 2] [1, 3] [4, 6] [5, 7];  pp groups: [0, 4] [1, 5] [2, 6] [3, 7]

`RankGrid` is plain arithmetic (no torch), so tests, the planner and the notebooks can build as many
as they like. comm/groups.py's `ProcessGroups` holds the torch.distributed groups of one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("pp", "dp", "cp", "tp")  # slowest to fastest
#: groups along two axes: "dp_cp", the ranks that hold the same parameters under context parallelism
#: (each its own samples or its own part of their sequence), over which gradients are reduced (Megatron-LM's
#: data-parallel-with-context-parallel group); created only when cp > 1
COMBINED = {"dp_cp": ("dp", "cp")}


def replica_group(cp: int) -> str:
    """The group whose ranks hold the same parameters — over which gradients reduce and ZeRO shards: "dp",
    or "dp_cp" under context parallelism."""
    return "dp_cp" if cp > 1 else "dp"


@dataclass(frozen=True, kw_only=True)
class RankGrid:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    #: expert parallelism, carved from dp (not a grid axis): ep groups are runs of ep consecutive dp
    #: indices (the ranks that share out the experts), edp groups the dp ranks at the same place in each
    #: run (the ranks that hold the same experts, over which expert gradients reduce)
    ep: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def coords(self, rank: int) -> dict[str, int]:
        """{'pp': k, 'dp': i, 'cp': c, 'tp': j} of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside a grid of {self.world_size} ranks")
        inner = self.cp * self.tp
        return {
            "pp": rank // (self.dp * inner),
            "dp": (rank // inner) % self.dp,
            "cp": (rank // self.tp) % self.cp,
            "tp": rank % self.tp,
        }

    def rank(self, pp: int = 0, dp: int = 0, tp: int = 0, cp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def group_ranks(self, axis: str, rank: int) -> list[int]:
        """The global ranks that share `rank`'s group along `axis` (all other coordinates fixed); `axis`
        may be a combined one of COMBINED ("dp_cp": the ranks that hold the same parameters)."""
        c = self.coords(rank)
        if axis in ("ep", "edp"):
            block, place = divmod(c["dp"], self.ep)
            dps = (
                [block * self.ep + i for i in range(self.ep)]
                if axis == "ep"
                else [j * self.ep + place for j in range(self.dp // self.ep)]
            )
            return [self.rank(**{**c, "dp": d}) for d in dps]
        members = [c]
        for a in COMBINED.get(axis, (axis,)):
            members = [{**m, a: i} for m in members for i in range(getattr(self, a))]
        return sorted(self.rank(**m) for m in members)

    def all_groups(self, axis: str) -> list[list[int]]:
        """Every group along `axis`, in a deterministic order (every rank must create them alike)."""
        seen: list[list[int]] = []
        for r in range(self.world_size):
            g = self.group_ranks(axis, r)
            if g not in seen:
                seen.append(g)
        return seen

    def describe(self, rank: int) -> str:
        c = self.coords(rank)
        return f"rank {rank} (dp {c['dp']}, tp {c['tp']}, pp {c['pp']}" + (
            f", cp {c['cp']})" if self.cp > 1 else ")"
        )


def node_groups(grid: RankGrid, ranks_per_node: int) -> list[tuple[str, list[int]]]:
    """Each dp group split by machine (rank // ranks_per_node), for the hierarchical all-reduce:
    `dp_intra` (the group's ranks on one machine) and `dp_inter` (one rank per machine, those at the same
    place in their machine's share). ValueError where the machines hold unequal shares of a dp group."""
    out: list[tuple[str, list[int]]] = []
    for members in grid.all_groups("dp"):
        by_node: dict[int, list[int]] = {}
        for r in members:
            by_node.setdefault(r // ranks_per_node, []).append(r)
        shares = {len(v) for v in by_node.values()}
        if len(shares) > 1:
            raise ValueError(
                f"dp group {members} is split unevenly over machines of {ranks_per_node} ranks: "
                f"{sorted(by_node.values())}"
            )
        out += [("dp_intra", v) for v in by_node.values()]
        out += [("dp_inter", [v[j] for v in by_node.values()]) for j in range(shares.pop())]
    return out
