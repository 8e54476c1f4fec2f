"""The traced communication layer: every collective and point-to-point operation goes through here.

Each operation is recorded once, on the `comm` lane, with the keys of docs/run-format.md: `op`, `group`,
`group_ranks`, `seq` (a per-group counter that is the same on every member, so one collective can be
joined across ranks), `bytes`, `dtype`, `peer` for point-to-point, and `algbw_GBps` / `busbw_GBps` as
nccl-tests defines them (algbw = S / t; busbw = algbw × 2(n−1)/n for all-reduce, (n−1)/n for all-gather
and reduce-scatter, 1 for broadcast and send/recv): a complete span for a blocking call on gloo, an async
begin/end pair from launch to completion otherwise (on CUDA from the device's times, at the step's end:
comm/device_timing.py).

Beside that record, where a call returns before the operation is done (every call on CUDA, async ones on
gloo), the host's *launch* is a short span on the `launch` lane, category `launch`, without bytes — the
summary never counts it — and the time the caller spent blocked in `wait()` is a span on the `wait` lane
(comm/handle.py).

Point-to-point transfers are posted as batches (`batch_isend_irecv`: one NCCL group), without tags:
NCCL has none, so the transfers between two ranks are matched in the order they are posted, which the
pipeline's validator checks. Before anything is posted, each tensor is checked against what NCCL accepts
(comm/strict.py: always its device on CUDA, every rule in strict mode).

Memory: gloo runs a reduce-scatter as an all-reduce of a full-size copy of its input (measured with
torch.profiler's memory events). The copy is counted under `comm_buffer` from the launch to `wait()`;
gloo's worker thread may hold it a little longer (until it takes the group's next operation), which
the allocator then shows as unattributed. NCCL makes no such copy.

With an emulated network (comm/emulated_link.py, a teaching device) a send is held before it is posted
and a collective completes no earlier than its emulated time after it finished. Every operation also
enters the flight recorder (comm/flight_recorder.py): the last 64, per rank.

A failure (a timeout, a peer that died) is re-raised as `CommError` naming this rank, the operation,
the group and the sequence number, so a stuck job ends with a message that says where it stopped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from workbench.comm import strict
from workbench.comm.device_timing import DeviceClock
from workbench.comm.emulated_link import EmulatedNetwork, emulate, hold
from workbench.comm.errors import CommError, comm_error
from workbench.comm.flight_recorder import FlightRecorder
from workbench.comm.handle import Handle, Op, device_record
from workbench.measure.memory import NO_MEMORY, MemoryCounter
from workbench.trace.bandwidth import nbytes, record
from workbench.trace.recorder import TraceRecorder, flow_id

if TYPE_CHECKING:
    from workbench.comm.groups import ProcessGroups

__all__ = ["CommError", "Communicator", "Handle"]

# torch 2.13 renamed the tensor forms of all-gather and reduce-scatter; older releases have the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_reduce_copy(copy: torch.Tensor, pg: Any, *, async_op: bool) -> Any:
    return dist.all_reduce(copy, group=pg, async_op=async_op)


def _keep_slice(out: torch.Tensor, full: torch.Tensor, pg: Any) -> None:
    """The end of a reduce-scatter done as gloo does it — an all-reduce of a full-size copy of the input —
    keeping this rank's slice (by the group's own rank order, as torch's reduce-scatter and all-gather
    shard) and releasing the copy's memory now (its storage resized to nothing, ZeRO-3's way of freeing):
    gloo's own reduce-scatter keeps its copy in its `Work`, which can outlive the wait — held in a reference
    cycle until the garbage collector runs, or by the backend's thread — and a whole bucket or unit was then
    left unattributed at the next step's peak on one rank or another (tests/test_true_peak.py: ZeRO-1's
    blocking call, ZeRO-3's asynchronous one)."""
    index = dist.get_rank(pg)
    out.copy_(full[index * out.numel() : (index + 1) * out.numel()])
    full.untyped_storage().resize_(0)


class Communicator:
    """Traced collectives over the process groups of one rank.

    It is handed what recording its operations needs — the recorder, the memory tracker (the backend's
    staging copies, under `comm_buffer`), the device clock (CUDA), the emulated network — and uses them
    for its own operations only: a piece that records or counts something of its own is handed the
    recorder or the memory tracker itself (engine/parallelize.py), not through the communicator.

    `step` is set by the training loop so that every record (and every flow id) carries it. `device` is
    the rank's (its tensors are checked against it); `timeout_s` the process groups' timeout, which also
    bounds a CUDA wait; `strict` checks every tensor as NCCL would (default: WORKBENCH_STRICT_COMM).
    """

    def __init__(
        self,
        groups: ProcessGroups,
        recorder: TraceRecorder,
        *,
        memory: MemoryCounter = NO_MEMORY,
        clock: DeviceClock | None = None,
        network: EmulatedNetwork | None = None,
        device: torch.device | None = None,
        timeout_s: float = 1800.0,
        strict_mode: bool | None = None,
    ) -> None:
        self.groups = groups
        self.network = network  # the emulated links, if any
        self.recorder = recorder
        self.memory = memory
        self.clock = clock  # CUDA: operations timed on the device
        self.device = device or torch.device("cpu")
        self.timeout_s = timeout_s
        self.strict = strict.enabled() if strict_mode is None else strict_mode
        self.flight = FlightRecorder()
        self.rank = groups.rank
        self.step = 0
        self._seq: dict[str, int] = defaultdict(int)
        #: gloo copies a reduce-scatter's input (see the module's docstring)
        self.backend_copies = dist.is_initialized() and dist.get_backend() == "gloo"
        self._p2p_seq: dict[tuple[str, int, int], int] = defaultdict(int)

    # ---- bookkeeping -------------------------------------------------------------------------
    def start_step(self, step: int) -> None:
        self.step = step
        if self.clock is not None:
            self.clock.start_step()

    def end_step(self, synchronized: bool = False) -> None:
        """CUDA: write the step's operations (and a fast step's spans) with their device times; `synchronized`:
        the caller has just synchronised the device (a fast step's one read)."""
        if self.clock is not None:
            self.clock.end_step(synchronized)

    def size(self, group: str) -> int:
        """How many ranks `group` has."""
        return self.groups.size(group)

    def index(self, group: str) -> int:
        """This rank's position in `group` (its slice of what the group shards)."""
        return self.groups.index(group)

    def members(self, group: str) -> list[int]:
        """The global ranks of `group`, in its order (a ring's neighbours)."""
        return self.groups.ranks[group]

    def check(self, tensors: list[torch.Tensor], op: str) -> None:
        """NCCL's rules for the tensors of `op` (comm/strict.py)."""
        strict.check(tensors, self.device, op, self.strict)

    def op_args(
        self, op: str, group: str, tensor: torch.Tensor, total_bytes: int, **extra: Any
    ) -> dict[str, Any]:
        """A new operation's record args on `group`, numbered with the group's next sequence number (a
        ring collective built from send/recv, comm/ring_allreduce.py, is numbered as the backend's are)."""
        self._seq[group] += 1
        return {
            "op": op,
            "group": group,
            "group_ranks": self.groups.ranks[group],
            "seq": self._seq[group],
            "step": self.step,
            "bytes": total_bytes,
            "dtype": str(tensor.dtype).replace("torch.", ""),
            **extra,
        }

    def error(self, args: dict[str, Any], e: BaseException) -> CommError:
        """The error for operation `args` failing on this rank (comm/errors.py)."""
        return comm_error(self.rank, args, e)

    def _launch_args(self, args: dict[str, Any], async_op: bool) -> dict[str, Any]:
        """What the host's launch span says: which operation, never its bytes (the record has them)."""
        keep = ("op", "group", "seq", "step", "label", "peer")
        return {**{k: args[k] for k in keep if k in args}, "async": async_op}

    def _run(
        self,
        args: dict[str, Any],
        fn: Any,
        *,
        async_op: bool,
        n: int,
        tensors: list[torch.Tensor],
        label: str | None = None,
        staged: int = 0,
        on_done: Callable[[], None] | None = None,
    ) -> Handle | None:
        """Launch `fn` (called with async_op) and record it; `on_done` runs once it is done (at the handle's
        wait for an async call)."""
        cat = "collective"  # point-to-point goes through batch_isend_irecv
        name = args["op"] if label is None else f"{args['op']} {label}"
        if label is not None:
            args["label"] = label
        self.check(tensors, name)
        rec = self.recorder
        self.flight.start(args)
        if self.network is not None:
            args.update(emulate(self.network, self.rank, args))
        # on CUDA even a blocking call returns before it is done
        if async_op or self.clock is not None:
            op = Op(name=name, cat=cat, args=args, n=n)
            timed = (
                None
                if self.clock is None
                else self.clock.launched(
                    ("collective", args["group"]), [device_record(rec, op, not async_op)]
                )
            )
            launch = rec.now_us()
            with rec.span(
                f"launch {name}", "launch", "launch", **self._launch_args(args, async_op)
            ):
                try:
                    work = fn(True)
                except Exception as e:
                    raise self.error(args, e) from e
            handle = Handle(
                self,
                [work],
                [op],
                launch_us=launch,
                staged=staged,
                timed=timed,
                blocking=not async_op,
                on_done=on_done,
            )
            if async_op:
                return handle
            handle.wait()  # CUDA: the host waits for the device, as gloo's blocking call does
            return None
        start = rec.now_us()
        try:
            fn(False)
        except Exception as e:
            raise self.error(args, e) from e
        if on_done is not None:
            on_done()
        hold(rec, args.get("emulated_s", 0.0), "comm", link=args.get("emulated_link"))
        self.flight.done(args)
        record(rec, name, cat, args, n=n, start=start, end=rec.now_us(), blocking=True)
        return None

    # ---- collectives -------------------------------------------------------------------------
    def all_reduce(
        self,
        tensor: torch.Tensor,
        group: str = "dp",
        *,
        async_op: bool = False,
        label: str | None = None,
        reduce_op: str = "sum",
        meta: dict[str, Any] | None = None,
    ) -> Handle | None:
        """Reduce `tensor` in place over `group` (sum, or max) with the backend's algorithm (our own
        send/recv ring is `comm.ring_allreduce.ring_all_reduce`). `meta` adds keys to the record."""
        n = self.size(group)
        args = self.op_args(
            "all_reduce", group, tensor, nbytes(tensor), algorithm="backend", **(meta or {})
        )
        if reduce_op != "sum":
            args["reduce_op"] = reduce_op
        rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[reduce_op]
        pg = self.groups.groups[group]
        return self._run(
            args,
            lambda a: dist.all_reduce(tensor, op=rop, group=pg, async_op=a),
            async_op=async_op,
            n=n,
            tensors=[tensor],
            label=label,
        )

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        group: str = "dp",
        *,
        async_op: bool = False,
        label: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Handle | None:
        """Sum `input` (n equal shards, concatenated on dim 0) over `group`; this rank keeps its shard."""
        n = self.size(group)
        args = self.op_args("reduce_scatter", group, input, nbytes(input), **(meta or {}))
        pg = self.groups.groups[group]
        out, inp = output.view(-1), input.reshape(-1)  # flat buffers: gloo needs them
        staged = nbytes(input) if self.backend_copies else 0
        launch: Callable[..., Any] = partial(_reduce_scatter, out, inp, group=pg)
        on_done = None
        if self.backend_copies and self.clock is None:
            # gloo's own way, with its copy released when it is done (blocking, or at the handle's wait)
            copy = inp.clone()
            launch = partial(_all_reduce_copy, copy, pg)
            on_done = partial(_keep_slice, out, copy, pg)
        return self._run(
            args,
            lambda a: launch(async_op=a),
            async_op=async_op,
            n=n,
            tensors=[output, input],
            label=label,
            staged=staged,
            on_done=on_done,
        )

    def all_gather(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        group: str = "dp",
        *,
        async_op: bool = False,
        label: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Handle | None:
        """Concatenate every rank's `input` (equal sizes) on dim 0 into `output` on every rank."""
        n = self.size(group)
        args = self.op_args("all_gather", group, output, nbytes(output), **(meta or {}))
        pg = self.groups.groups[group]
        out, inp = output.view(-1), input.reshape(-1)  # flat buffers: gloo needs them
        return self._run(
            args,
            lambda a: _all_gather(out, inp, group=pg, async_op=a),
            async_op=async_op,
            n=n,
            tensors=[output, input],
            label=label,
        )

    def all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        group: str = "dp",
        *,
        label: str | None = None,
        meta: dict[str, Any] | None = None,
        output_splits: list[int] | None = None,
        input_splits: list[int] | None = None,
    ) -> None:
        """Block r of every rank's `input` goes to rank r: `output` holds them in rank order. Equal blocks, or
        rows of dim 0 by `input_splits` (sent to each rank) and `output_splits` (received from each): the
        variable all-to-all of expert parallelism's dropless dispatch. The record has both lists."""
        if input_splits is not None:
            meta = {
                **(meta or {}),
                "send_splits": list(input_splits),
                "recv_splits": list(output_splits or []),
            }
        args = self.op_args("all_to_all", group, input, nbytes(input), **(meta or {}))
        pg = self.groups.groups[group]
        out, inp = (output.view(-1), input.reshape(-1)) if input_splits is None else (output, input)

        def fn(a: bool):
            return dist.all_to_all_single(
                out,
                inp,
                output_split_sizes=output_splits,
                input_split_sizes=input_splits,
                group=pg,
                async_op=a,
            )

        self._run(
            args, fn, async_op=False, n=self.size(group), tensors=[output, input], label=label
        )

    def broadcast(
        self,
        tensor: torch.Tensor,
        src: int,
        group: str = "world",
        async_op: bool = False,
        label: str | None = None,
    ) -> Handle | None:
        """Copy `tensor` from global rank `src` to every member of `group`."""
        n = self.size(group)
        args = self.op_args("broadcast", group, tensor, nbytes(tensor), peer=src)
        pg = self.groups.groups[group]
        return self._run(
            args,
            lambda a: dist.broadcast(tensor, src=src, group=pg, async_op=a),
            async_op=async_op,
            n=n,
            tensors=[tensor],
            label=label,
        )

    def barrier(self, group: str = "world") -> None:
        pg = self.groups.groups[group]
        args = {
            "op": "barrier",
            "group": group,
            "group_ranks": self.groups.ranks[group],
            "step": self.step,
        }
        try:
            dist.barrier(group=pg)
        except Exception as e:
            raise self.error(args, e) from e

    # ---- point to point ----------------------------------------------------------------------
    def _p2p_args(self, op: str, tensor: torch.Tensor, peer: int, group: str) -> dict[str, Any]:
        src, dst = (self.rank, peer) if op == "send" else (peer, self.rank)
        self._p2p_seq[(group, src, dst)] += 1
        seq = self._p2p_seq[(group, src, dst)]
        transfer = (group, tuple(self.groups.ranks[group]), seq, src, dst)  # the same on both ranks
        return {
            "op": op,
            "group": group,
            "group_ranks": self.groups.ranks[group],
            "seq": seq,
            "step": self.step,
            "peer": peer,
            "bytes": nbytes(tensor),
            "dtype": str(tensor.dtype).replace("torch.", ""),
            "flow": flow_id("p2p", self.step, *transfer),
        }

    def batch_isend_irecv(
        self, transfers: list[tuple[str, torch.Tensor, int, str | None]], group: str = "pp"
    ) -> Handle:
        """Post `transfers` — ("send" | "recv", tensor, global peer rank, label) — together, as one
        `torch.distributed.batch_isend_irecv` (one NCCL group: its sends and receives cannot block each
        other). No tags: between two ranks, transfers are matched in the order both post them. Each
        transfer is recorded on its own (flows from each send to its receive); `wait()` waits for all."""
        rec, pg = self.recorder, self.groups.groups[group]
        self.check(
            [t for _, t, _, _ in transfers],
            "p2p batch ("
            + ", ".join(f"{k} {lbl or ''}".strip() for k, _, _, lbl in transfers)
            + ")",
        )
        ops, p2p = [], []
        for kind, tensor, peer, label in transfers:
            args = self._p2p_args(kind, tensor, peer, group)
            if label is not None:
                args["label"] = label
            self.flight.start(args)
            if self.network is not None:
                args.update(emulate(self.network, self.rank, args))
            name = kind if label is None else f"{kind} {label}"
            ops.append(Op(name=name, cat="p2p", args=args, n=2))
            p2p.append(
                dist.P2POp(dist.isend if kind == "send" else dist.irecv, tensor, peer, group=pg)
            )
        peers = tuple(sorted({op.args["peer"] for op in ops}))
        timed = (
            None
            if self.clock is None
            else self.clock.launched(
                ("p2p", group, peers), [device_record(rec, op, False) for op in ops]
            )
        )
        launch = rec.now_us()
        with rec.span(
            f"launch p2p batch of {len(ops)}" if len(ops) > 1 else f"launch {ops[0].name}",
            "launch",
            "launch",
            op="p2p batch",
            group=group,
            step=self.step,
            peers=list(peers),
            transfers=len(ops),
        ):
            for op in ops:
                # held on the emulated link, then the flow to the receive starts
                if op.args["op"] == "send":
                    hold(
                        rec,
                        op.args.get("emulated_s", 0.0),
                        "launch",
                        link=op.args.get("emulated_link"),
                    )
                    rec.flow("s", op.args["flow"], "launch", rec.now_us(), "p2p")
            try:
                works = dist.batch_isend_irecv(p2p)
            except Exception as e:
                raise self.error(ops[0].args, e) from e
        return Handle(self, list(works), ops, launch_us=launch, timed=timed)

    def send(
        self, tensor: torch.Tensor, dst: int, group: str = "pp", label: str | None = None
    ) -> None:
        self.isend(tensor, dst, group, label).wait()

    def recv(
        self, tensor: torch.Tensor, src: int, group: str = "pp", label: str | None = None
    ) -> None:
        self.irecv(tensor, src, group, label).wait()

    def isend(
        self, tensor: torch.Tensor, dst: int, group: str = "pp", label: str | None = None
    ) -> Handle:
        """Send to global rank `dst` (a batch of one); the flow to the matching receive starts at the launch."""
        return self.batch_isend_irecv([("send", tensor, dst, label)], group)

    def irecv(
        self, tensor: torch.Tensor, src: int, group: str = "pp", label: str | None = None
    ) -> Handle:
        """Receive from global rank `src` (a batch of one); the flow ends when the receive is waited for."""
        return self.batch_isend_irecv([("recv", tensor, src, label)], group)
