"""The process groups of one rank, one per axis of its rank grid (config/grid.py) plus the world, created
once with the run's timeout and passed explicitly to everything that communicates — there is no
module-level global."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from workbench.config.grid import AXES, RankGrid, node_groups


@dataclass(kw_only=True)
class ProcessGroups:
    """The process groups one rank belongs to, one per axis plus the world."""

    grid: RankGrid
    rank: int
    groups: dict[str, Any]  # axis -> torch ProcessGroup (or None for the world group)
    ranks: dict[str, list[int]]  # axis -> global ranks in this rank's group

    @classmethod
    def create(
        cls, grid: RankGrid, rank: int, timeout_s: float, ranks_per_node: int = 0
    ) -> ProcessGroups:
        """Create every axis group (collectively: all ranks call this in the same order); with
        `ranks_per_node` also each dp group's split by machine (`node_groups`)."""
        timeout = timedelta(seconds=timeout_s)
        groups: dict[str, Any] = {"world": dist.group.WORLD}
        ranks: dict[str, list[int]] = {"world": list(range(grid.world_size))}
        for axis in AXES:
            # no context parallelism: no group to create (or wait for)
            if axis == "cp" and grid.cp == 1:
                groups[axis], ranks[axis] = None, [rank]
                continue
            for members in grid.all_groups(axis):
                # new_group is collective over the whole world, even for ranks outside `members`.
                # named in torch's dumps
                pg = dist.new_group(members, timeout=timeout, group_desc=f"{axis} {members}")
                if rank in members:
                    groups[axis], ranks[axis] = pg, members
        for axis in ("ep", "edp") if grid.ep > 1 else ():
            for members in grid.all_groups(axis):
                pg = dist.new_group(members, timeout=timeout, group_desc=f"{axis} {members}")
                if rank in members:
                    groups[axis], ranks[axis] = pg, members
        if grid.cp > 1:
            for members in grid.all_groups("dp_cp"):
                pg = dist.new_group(members, timeout=timeout, group_desc=f"dp_cp {members}")
                if rank in members:
                    groups["dp_cp"], ranks["dp_cp"] = pg, members
        if ranks_per_node:
            for name, members in node_groups(grid, ranks_per_node):
                pg = dist.new_group(members, timeout=timeout, group_desc=f"{name} {members}")
                if rank in members:
                    groups[name], ranks[name] = pg, members
        return cls(grid=grid, rank=rank, groups=groups, ranks=ranks)

    def size(self, axis: str) -> int:
        return len(self.ranks[axis])

    def index(self, axis: str) -> int:
        """This rank's position within its group along `axis`."""
        return self.ranks[axis].index(self.rank)
