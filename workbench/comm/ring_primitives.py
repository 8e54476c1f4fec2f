"""The other ring collectives from send/recv, recorded step by step like the ring all-reduce
(comm/ring_allreduce.py), each equal to the backend's own (tests/test_ring_primitives.py):

    reduce-scatter  n−1 steps; step k: rank i sends its running sum of chunk (i−k−1) mod n to i+1 and
                    adds the one it receives, chunk (i−k−2) mod n. After n−1 steps rank i holds the sum
                    of chunk i (torch's layout: rank r keeps the r-th chunk). Each rank sends (n−1)/n·S.
    all-gather      n−1 steps; step k: rank i sends chunk (i−k) mod n — its own first — and receives
                    chunk (i−k−1) mod n. Each rank sends (n−1)/n·S of the S-byte output.
    broadcast       a pipelined chain along the ring from the source, the buffer cut into n chunks: the
                    rank d hops after the source receives chunk j at step j+d−1 and forwards it at j+d,
                    n+n−2 steps in all. Every rank but the last sends S bytes (the bus factor 1).

An all-reduce is a reduce-scatter followed by an all-gather: the ring all-reduce runs exactly these two
phases over the same chunks.
"""

from __future__ import annotations

import torch

from workbench.comm.ring_allreduce import RingCall, ring_chunks
from workbench.comm.traced import Communicator


def ring_reduce_scatter(
    comm: Communicator,
    output: torch.Tensor,
    input: torch.Tensor,
    group: str = "dp",
    label: str | None = None,
) -> None:
    """`output` (on rank i) = the sum over ranks of the i-th of n equal chunks of `input`."""
    call = RingCall(comm, "reduce_scatter", group, input, label)
    n, i = call.n, call.i
    chunks = list(input.clone().view(-1).chunk(n))  # running sums, so the input is left as it was
    if chunks[0].numel() != output.numel():
        raise ValueError(
            f"reduce-scatter over {n} ranks needs an input of {n} × the output's {output.numel()} "
            f"values, got {input.numel()}"
        )
    incoming = torch.empty_like(chunks[0])
    for k in range(n - 1):
        send_c, recv_c = (i - k - 1) % n, (i - k - 2) % n
        call.exchange("reduce_scatter", k, chunks[send_c], incoming, send_c=send_c, recv_c=recv_c)
        chunks[recv_c].add_(incoming)
    output.view(-1).copy_(chunks[i])
    call.finish()


def ring_all_gather(
    comm: Communicator,
    output: torch.Tensor,
    input: torch.Tensor,
    group: str = "dp",
    label: str | None = None,
) -> None:
    """`output` = every rank's `input` (equal sizes) concatenated in rank order."""
    call = RingCall(comm, "all_gather", group, output, label)
    n, i = call.n, call.i
    chunks = list(output.view(-1).chunk(n))
    chunks[i].copy_(input.view(-1))
    for k in range(n - 1):
        send_c, recv_c = (i - k) % n, (i - k - 1) % n
        call.exchange("all_gather", k, chunks[send_c], chunks[recv_c], send_c=send_c, recv_c=recv_c)
    call.finish()


def ring_broadcast(
    comm: Communicator, tensor: torch.Tensor, src: int, group: str = "dp", label: str | None = None
) -> None:
    """Copy `tensor` from global rank `src` to every member of `group`, chunk by chunk down the ring."""
    call = RingCall(comm, "broadcast", group, tensor, label)
    n = call.n
    call.args["peer"] = src
    d = (call.i - call.members.index(src)) % n  # hops after the source
    flat = tensor.view(-1)
    chunks = [flat[o : o + length] for o, length in ring_chunks(flat.numel(), n)]
    for t in range(2 * n - 2):
        send_c, recv_c = t - d, t - d + 1
        send = chunks[send_c] if d < n - 1 and 0 <= send_c < n else None
        recv = chunks[recv_c] if d > 0 and 0 <= recv_c < n else None
        if send is not None or recv is not None:
            call.exchange(
                "broadcast",
                t,
                send,
                recv,
                send_c=send_c if send is not None else None,
                recv_c=recv_c if recv is not None else None,
            )
    call.finish()
