"""Ring all-reduce built from send/recv, one recorded span per step (Patarasuk & Yuan 2009; the
algorithm behind Baidu's ring all-reduce and NCCL's ring).

The flat buffer of S bytes is cut into n chunks (sizes differ by at most one element when n does
not divide it). Rank i sends to i+1 and receives from i−1 (mod n), 2(n−1) steps in all:

    reduce-scatter, step k = 0..n−2:  send chunk (i−k) mod n, receive chunk (i−k−1) mod n and add it.
        After n−1 steps rank i holds the complete sum of chunk (i+1) mod n.
    all-gather,     step k = 0..n−2:  send chunk (i+1−k) mod n, receive chunk (i−k) mod n and copy it.

Every rank sends 2(n−1)·S/n bytes, which is why the ring's time hardly grows with n. Each step is a
`ring_step` span on the `ring` lane (phase, step, chunks, peers, bytes) with a flow to the rank that
receives it. The send and receive of a step are posted together, so no step can deadlock.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workbench.comm.bandwidth import bandwidth, nbytes
from workbench.comm.traced import Communicator
from workbench.trace.recorder import flow_id


def ring_chunks(numel: int, n: int) -> list[tuple[int, int]]:
    """(offset, length) of each of the n chunks of a flat buffer, as torch.tensor_split cuts it."""
    base, extra = divmod(numel, n)
    out, offset = [], 0
    for c in range(n):
        length = base + (1 if c < extra else 0)
        out.append((offset, length))
        offset += length
    return out


def ring_all_reduce(comm: Communicator, tensor: torch.Tensor, group: str = "dp", label: str | None = None) -> None:
    """Sum `tensor` in place over `group` with the ring algorithm (blocking)."""
    members = comm.groups.ranks[group]
    n = len(members)
    rec = comm.recorder
    args = comm._args("all_reduce", group, tensor, nbytes(tensor), algorithm="ring")
    if label is not None:
        args["label"] = label
    if n == 1:
        return
    flat = tensor.view(-1)
    i = members.index(comm.rank)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
    chunks = [flat[o:o + length] for o, length in ring_chunks(flat.numel(), n)]
    scratch = torch.empty_like(chunks[0])  # the largest chunk: receive buffer for the reduce phase
    if comm.memory is not None:
        comm.memory.add("comm_buffer", nbytes(scratch))
        comm.memory.snapshot()
    pg = comm.groups.groups[group]
    key = (comm.step, group, tuple(members), args["seq"])
    start = rec.now_us()
    try:
        for phase in ("reduce_scatter", "all_gather"):
            for k in range(n - 1):
                if phase == "reduce_scatter":
                    send_c, recv_c = (i - k) % n, (i - k - 1) % n
                    incoming = scratch[: chunks[recv_c].numel()]
                else:
                    send_c, recv_c = (i + 1 - k) % n, (i - k) % n
                    incoming = chunks[recv_c]
                ring_k = k if phase == "reduce_scatter" else n - 1 + k
                with rec.span("ring_step", "ring_step", "ring", phase=phase, ring_step=ring_k, step=comm.step,
                              seq=args["seq"], group=group, send_chunk=send_c, recv_chunk=recv_c, peer=nxt,
                              recv_peer=prv, bytes=nbytes(chunks[send_c]), recv_bytes=nbytes(incoming),
                              chunks=n):
                    rec.flow("s", flow_id("ring", *key, ring_k, comm.rank, nxt), "ring", rec.now_us(), "ring")
                    try:
                        ops = [dist.P2POp(dist.isend, chunks[send_c], nxt, group=pg),
                               dist.P2POp(dist.irecv, incoming, prv, group=pg)]
                        for work in dist.batch_isend_irecv(ops):
                            work.wait()
                    except Exception as e:  # noqa: BLE001
                        raise comm.error({**args, "peer": nxt}, e) from e
                    if phase == "reduce_scatter":
                        chunks[recv_c].add_(incoming)
                    rec.flow("f", flow_id("ring", *key, ring_k, prv, comm.rank), "ring", rec.now_us(), "ring")
    finally:
        if comm.memory is not None:
            comm.memory.add("comm_buffer", -nbytes(scratch))
            comm.memory.snapshot()
    dur = rec.now_us() - start
    algbw, busbw = bandwidth("all_reduce", args["bytes"], dur / 1e6, n)
    args.update(algbw_GBps=round(algbw, 4), busbw_GBps=round(busbw, 4))
    name = "all_reduce" if label is None else f"all_reduce {label}"
    rec.complete(name, "collective", "comm", start, dur, args)
