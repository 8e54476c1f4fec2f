"""Ring all-reduce built from send/recv, one recorded span per step (Patarasuk & Yuan 2009; the
algorithm behind Baidu's ring all-reduce and NCCL's ring).

The flat buffer of S bytes is cut into n chunks (sizes differ by at most one element when n does
not divide it). Rank i sends to i+1 and receives from i−1 (mod n), 2(n−1) steps in all:

    reduce-scatter, step k = 0..n−2:  send chunk (i−k) mod n, receive chunk (i−k−1) mod n and add it.
        After n−1 steps rank i holds the complete sum of chunk (i+1) mod n.
    all-gather,     step k = 0..n−2:  send chunk (i+1−k) mod n, receive chunk (i−k) mod n and copy it.

Every rank sends 2(n−1)·S/n bytes, which is why the ring's time hardly grows with n. Each step is a
`ring_step` span on the `ring` lane (phase, step, chunks, peers, bytes) with a flow to the rank that
receives it. The send and receive of a step are posted together, so no step can deadlock. On CUDA each
step blocks the host until the device has done it (comm/device_timing.py): the span is the step's time on
the GPU, not its launch, and `device_us` is the device's own measure of it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workbench.comm.emulated_link import hold
from workbench.comm.traced import Communicator
from workbench.trace.bandwidth import bandwidth, nbytes
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


class RingCall:
    """One ring collective being recorded: its args (op, group, seq ...), members and neighbours."""

    def __init__(
        self, comm: Communicator, op: str, group: str, tensor: torch.Tensor, label: str | None
    ) -> None:
        self.comm, self.group, self.label = comm, group, label
        self.members = comm.members(group)
        self.n = len(self.members)
        self.i = self.members.index(comm.rank)
        self.nxt, self.prv = (
            self.members[(self.i + 1) % self.n],
            self.members[(self.i - 1) % self.n],
        )
        self.args = comm.op_args(op, group, tensor, nbytes(tensor), algorithm="ring")
        if label is not None:
            self.args["label"] = label
        self.key = (comm.step, group, tuple(self.members), self.args["seq"])
        self.start = comm.recorder.now_us()

    def exchange(
        self,
        phase: str,
        ring_k: int,
        send: torch.Tensor | None,
        recv: torch.Tensor | None,
        *,
        send_c: int | None = None,
        recv_c: int | None = None,
    ) -> None:
        """One ring step: send to the next rank and receive from the previous one, posted together (either
        may be None in a broadcast's chain), as a `ring_step` span with a flow to the receiver."""
        rec, comm, pg = self.comm.recorder, self.comm, self.comm.groups.groups[self.group]
        with rec.span(
            "ring_step",
            "ring_step",
            "ring",
            phase=phase,
            ring_step=ring_k,
            step=comm.step,
            seq=self.args["seq"],
            group=self.group,
            send_chunk=send_c,
            recv_chunk=recv_c,
            peer=self.nxt,
            recv_peer=self.prv,
            bytes=nbytes(send) if send is not None else 0,
            recv_bytes=nbytes(recv) if recv is not None else 0,
            chunks=self.n,
        ) as step_args:
            # held on its emulated link, sender side
            if send is not None and comm.network is not None:
                link, seconds = comm.network.message_seconds(comm.rank, self.nxt, nbytes(send))
                hold(rec, seconds, "ring", link=link)
            if send is not None:
                rec.flow(
                    "s",
                    flow_id("ring", *self.key, ring_k, comm.rank, self.nxt),
                    "ring",
                    rec.now_us(),
                    "ring",
                )
            comm.check([t for t in (send, recv) if t is not None], f"ring step {ring_k}")
            ops = (
                [dist.P2POp(dist.isend, send, self.nxt, group=pg)] if send is not None else []
            ) + ([dist.P2POp(dist.irecv, recv, self.prv, group=pg)] if recv is not None else [])
            clock = comm.clock
            start = clock.mark() if clock is not None else None
            try:
                works = dist.batch_isend_irecv(ops) if ops else []
                for work in works:
                    work.wait()
                if clock is not None and start is not None:  # CUDA: done when the device says so
                    end = clock.mark()
                    clock.block_until(end, rec.now_us() + comm.timeout_s * 1e6)
                    step_args["device_us"] = round(start.elapsed_time(end) * 1000.0, 3)
            except Exception as e:
                raise comm.error({**self.args, "peer": self.nxt}, e) from e
            if recv is not None:
                rec.flow(
                    "f",
                    flow_id("ring", *self.key, ring_k, self.prv, comm.rank),
                    "ring",
                    rec.now_us(),
                    "ring",
                )

    def finish(self) -> None:
        """The whole collective's record on the `comm` lane, with its bandwidth."""
        rec = self.comm.recorder
        dur = rec.now_us() - self.start
        algbw, busbw = bandwidth(self.args["op"], self.args["bytes"], dur / 1e6, self.n)
        self.args.update(algbw_GBps=round(algbw, 4), busbw_GBps=round(busbw, 4))
        name = self.args["op"] if self.label is None else f"{self.args['op']} {self.label}"
        rec.complete(name, "collective", "comm", ts=self.start, dur=dur, args=self.args)


def ring_all_reduce(
    comm: Communicator, tensor: torch.Tensor, group: str = "dp", label: str | None = None
) -> None:
    """Sum `tensor` in place over `group` with the ring algorithm (blocking): a reduce-scatter, then an
    all-gather, over the same n chunks."""
    call = RingCall(comm, "all_reduce", group, tensor, label)
    n, i = call.n, call.i
    if n == 1:
        return
    flat = tensor.view(-1)
    chunks = [flat[o : o + length] for o, length in ring_chunks(flat.numel(), n)]
    scratch = torch.empty_like(chunks[0])  # the largest chunk: receive buffer for the reduce phase
    comm.memory.add("comm_buffer", nbytes(scratch))
    comm.memory.snapshot()
    try:
        for k in range(n - 1):
            send_c, recv_c = (i - k) % n, (i - k - 1) % n
            incoming = scratch[: chunks[recv_c].numel()]
            call.exchange(
                "reduce_scatter", k, chunks[send_c], incoming, send_c=send_c, recv_c=recv_c
            )
            chunks[recv_c].add_(incoming)
        for k in range(n - 1):
            send_c, recv_c = (i + 1 - k) % n, (i - k) % n
            call.exchange(
                "all_gather",
                n - 1 + k,
                chunks[send_c],
                chunks[recv_c],
                send_c=send_c,
                recv_c=recv_c,
            )
    finally:
        comm.memory.add("comm_buffer", -nbytes(scratch))
        comm.memory.snapshot()
    call.finish()
