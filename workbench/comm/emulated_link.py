"""An emulated network — a teaching device, labelled as such wherever it shows.

On one machine every link looks alike, so the brief's "data parallelism is bandwidth-sensitive,
pipeline parallelism latency-sensitive" cannot be seen. `--emulate-link 'inter=BW_GBps,LATENCY_us;
intra=BW_GBps,LATENCY_us'` (either part may be left out) gives the ranks emulated machines of
`ranks_per_node` ranks each: a message between two machines crosses the `inter` link, one inside a
machine the `intra` link. The machines take their ranks in `node_placement`'s order: 'block' (consecutive
ranks share a machine, as torchrun numbers each node's ranks; Megatron's order then keeps a tensor-parallel
group on one machine) or 'round-robin' (rank r on machine r mod M: each tensor-parallel group spread over the
machines, as a grid laid out in the wrong order would be). The traced communication layer holds each message for

    latency + bytes / bandwidth

on the sending side (the data and the results are untouched), and marks the held time as an `emulated`
span. A point-to-point send is held before it is posted. A backend collective (whose messages gloo or
NCCL send themselves) is held, on every rank, for the time its ring would take on the slowest link it
crosses: 2(n−1) steps of S/n bytes for an all-reduce, n−1 for an all-gather or reduce-scatter, and a
pipelined chain of n−1 hops for a broadcast; an asynchronous one holds the link from its launch (or from
when the one before it on the link is done) for that long, and its wait() returns no earlier. Our own
rings (comm/ring_allreduce.py, ring_primitives.py) hold each step's send on its own link.
No torch here; the spec's parsing is the configuration's (config/links.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from workbench.config.links import Link, parse_links
from workbench.trace.bandwidth import bus_factor
from workbench.trace.recorder import TraceRecorder

__all__ = ["EmulatedNetwork", "Link", "emulate", "hold", "parse_links"]


#: ring steps of each collective over n ranks (each pays the latency); the bytes each rank sends in all
#: are the bus-bandwidth factor's (trace/bandwidth.py)
_RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: n - 1,
    "all_gather": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
}


@dataclass(kw_only=True)
class EmulatedNetwork:
    """Which emulated machine each rank is on, how long a message takes between two of them, and until
    when this rank's side of each link is busy (asynchronous collectives queue on it one after another)."""

    links: dict[str, Link]
    ranks_per_node: int
    #: 'block' (machine = rank // ranks_per_node) or 'round-robin' (machine = rank mod machines)
    placement: str = "block"
    world_size: int = 0
    busy_until_us: dict[str, float] = field(default_factory=dict)

    def occupy(self, link: str, start_us: float, seconds: float) -> float:
        """An asynchronous collective launched at `start_us`: it has the link once the ones before it are
        done, for `seconds`; returns when it ends (µs)."""
        start = max(start_us, self.busy_until_us.get(link, 0.0))
        self.busy_until_us[link] = start + seconds * 1e6
        return self.busy_until_us[link]

    def __post_init__(self) -> None:
        if self.placement == "round-robin" and (
            self.world_size < 1 or self.world_size % self.ranks_per_node
        ):
            raise ValueError(
                f"round-robin placement needs machines of ranks_per_node={self.ranks_per_node} that "
                f"split world_size={self.world_size} evenly"
            )

    def node(self, rank: int) -> int:
        if self.placement == "round-robin":
            return rank % (self.world_size // self.ranks_per_node)
        return rank // self.ranks_per_node

    def link(self, ranks: list[int]) -> tuple[str, Link | None]:
        """The slowest link a group of ranks' traffic crosses: 'inter' if they span machines."""
        name = "inter" if len({self.node(r) for r in ranks}) > 1 else "intra"
        return name, self.links.get(name)

    def message_seconds(self, src: int, dst: int, nbytes: int) -> tuple[str, float]:
        name, link = self.link([src, dst])
        return name, link.seconds(nbytes) if link is not None else 0.0

    def collective_seconds(self, op: str, nbytes: int, members: list[int]) -> tuple[str, float]:
        name, link = self.link(members)
        n = len(members)
        if link is None or n == 1 or op not in _RING_STEPS:
            return name, 0.0
        # a broadcast is a pipelined chain: n−1 latencies, the bytes once (its bus factor is 1)
        sent = bus_factor(op, n) * nbytes
        return name, _RING_STEPS[op](n) * link.latency_us * 1e-6 + sent / (
            link.bandwidth_GBps * 1e9
        )


def hold(recorder: TraceRecorder, seconds: float, lane: str, **args: object) -> None:
    """Hold the calling rank `seconds` inside an `emulated` span on `lane` of `recorder`."""
    if seconds <= 0:
        return
    with recorder.span("emulated link", "emulated", lane, seconds=round(seconds, 6), **args):
        time.sleep(seconds)


def emulate(network: EmulatedNetwork, rank: int, args: dict) -> dict:
    """The emulated time of one traced operation (its args: op, bytes, peer, group_ranks), as the keys
    `emulated_s` and `emulated_link` to add to them; nothing for a receive (a message is held where it
    is sent) or where no emulated link applies."""
    if args["op"] == "recv":
        return {}
    link, seconds = (
        network.message_seconds(rank, args["peer"], args["bytes"])
        if args["op"] == "send"
        else network.collective_seconds(args["op"], args["bytes"], args["group_ranks"])
    )
    return {"emulated_s": round(seconds, 9), "emulated_link": link} if seconds > 0 else {}
