"""Hierarchical all-reduce: the brief's "NVLink inside a machine, InfiniBand between", in three phases
(the two-level scheme of Horovod's hierarchical all-reduce and NCCL's trees over rings):

    1. reduce-scatter inside the machine (group `dp_intra`, K ranks): each rank holds its machine's sum
       of one K-th of the buffer;
    2. all-reduce across machines between peers (group `dp_inter`, m ranks, one per machine): that K-th,
       summed over every machine;
    3. all-gather inside the machine: every rank holds the whole sum.

Bytes one rank sends across machines: 2(m−1)/m · S/K, against the flat ring's 2(n−1)/n · S (n = m·K),
every step of which crosses the slow link once the ring spans machines. Where a machine's K ranks share one
link (a local cluster's node), that link carries 2(m−1)/m · S each way against the flat ring's 2(n−1)/n · S
(predict.formulas.node_link_bytes: 1.5× for 2 machines of 2, measured in studies/wire.py). With --emulate-link
(a link per rank) or on a cluster the difference shows in time (notebook 09). Each phase is a traced
backend collective on its own group, so the trace's lanes show the intra and inter groups. Blocking, like
our ring: no overlap with backward.
"""

from __future__ import annotations

import torch

from workbench.comm.traced import Communicator
from workbench.trace.bandwidth import nbytes


def hierarchical_all_reduce(
    comm: Communicator, tensor: torch.Tensor, label: str | None = None
) -> None:
    """Sum `tensor` in place over the dp group, machine by machine (needs the `dp_intra`/`dp_inter`
    groups: ProcessGroups.create with ranks_per_node)."""
    k, flat = comm.size("dp_intra"), tensor.view(-1)
    pad = (-flat.numel()) % k  # the intra reduce-scatter needs K equal shares
    work = flat if pad == 0 else torch.cat([flat, flat.new_zeros(pad)])
    shard = work.new_empty(work.numel() // k) if k > 1 else work
    staged = (nbytes(shard) if k > 1 else 0) + (nbytes(work) if pad else 0)
    name = label or "all_reduce"
    if staged:
        comm.memory.add("comm_buffer", staged)
        comm.memory.snapshot()
    try:
        if k > 1:
            comm.reduce_scatter(shard, work, "dp_intra", label=f"{name} (intra)")
        if comm.size("dp_inter") > 1:
            comm.all_reduce(shard, "dp_inter", label=f"{name} (inter)")
        if k > 1:
            comm.all_gather(work, shard, "dp_intra", label=f"{name} (intra)")
        if pad:
            flat.copy_(work[: flat.numel()])
    finally:
        if staged:
            comm.memory.add("comm_buffer", -staged)
            comm.memory.snapshot()
