"""The traced communication layer: every collective and point-to-point operation goes through here.

Each operation is recorded on the `comm` lane with the keys of docs/run-format.md: `op`, `group`,
`group_ranks`, `seq` (a per-group counter that is the same on every member, so one collective can be
joined across ranks), `bytes`, `dtype`, `peer` for point-to-point, and `algbw_GBps` / `busbw_GBps`
as nccl-tests defines them (algbw = S / t; busbw = algbw × 2(n−1)/n for all-reduce, (n−1)/n for
all-gather and reduce-scatter, 1 for broadcast and send/recv).

An asynchronous operation is recorded twice: its launch (a short span on `comm` plus an async
begin/end pair from launch to completion, the completion time taken from the backend's future where
it has one) and, separately, the time the caller spent blocked in `wait()` (a span on the `wait` lane).

Memory: gloo runs a reduce-scatter as an all-reduce of a full-size copy of its input (measured with
torch.profiler's memory events). The copy is counted under `comm_buffer` from the launch to `wait()`;
gloo's worker thread may hold it a little longer (until it takes the group's next operation), which
the allocator then shows as unattributed. NCCL makes no such copy.

On CUDA, operations are timed on the device and written when the step ends (comm/device_timing.py).
With an emulated network (comm/emulated_link.py, a teaching device) a send is held before it is posted
and a collective completes no earlier than its emulated time after it finished.
Every operation also enters the flight recorder (comm/flight_recorder.py): the last 64, per rank.

A failure (a timeout, a peer that died) is re-raised as `CommError` naming this rank, the operation,
the group and the sequence number, so a stuck job ends with a message that says where it stopped.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from workbench.comm.bandwidth import nbytes, record
from workbench.comm.device_timing import DeviceClock, Timed
from workbench.comm.emulated_link import EmulatedNetwork, emulate, hold
from workbench.comm.flight_recorder import FlightRecorder
from workbench.trace.recorder import TraceRecorder, flow_id

if TYPE_CHECKING:
    from workbench.grid import ProcessGroups
    from workbench.measure.memory import MemoryTracker


# torch 2.13 renamed the tensor forms of all-gather and reduce-scatter; older releases have the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class CommError(RuntimeError):
    """A communication operation failed or timed out; the message says which rank and operation."""


class Handle:
    """An operation in flight. `wait()` blocks, records the blocked time, and closes the async span."""

    def __init__(self, comm: Communicator, work: Any, name: str, cat: str, args: dict[str, Any],
                 launch_us: float, n: int, staged: int = 0, launch_event: Any = None, blocking: bool = False) -> None:
        self.comm, self.work, self.name, self.cat, self.args = comm, work, name, cat, args
        self.launch_us, self.n, self.launch_event, self.blocking = launch_us, n, launch_event, blocking
        self.staged = staged if comm.memory is not None else 0  # the backend's own copy (comm_buffer)
        if self.staged:
            comm.memory.add("comm_buffer", self.staged)
        self.completed_us: float | None = None
        self._waited = False
        rec = comm.recorder
        if launch_event is not None:
            return  # device-timed: the step's end resolves it
        try:  # collectives on gloo expose a future that completes with the work: the completion time
            work.get_future().then(lambda _f: self._mark_done(rec.now_us()))
        except (RuntimeError, AttributeError):
            pass  # point-to-point work has no future on gloo: completion is known at wait()

    def _mark_done(self, ts: float) -> None:
        if self.completed_us is None:
            self.completed_us = ts

    def _release_staged(self) -> None:
        staged, self.staged = self.staged, 0
        if staged and self.comm.memory is not None:
            self.comm.memory.add("comm_buffer", -staged)

    def wait(self) -> None:
        if self._waited:
            return
        rec = self.comm.recorder
        with rec.span(f"wait {self.name}", "wait", "wait", op=self.args["op"], group=self.args["group"],
                      seq=self.args.get("seq")):
            try:
                self.work.wait()
            except Exception as e:  # noqa: BLE001 - re-raised with where it happened
                raise self.comm.error(self.args, e) from e
            if self.args.get("emulated_s") and self.args["op"] != "send":  # the emulated network's time
                link = self.args["emulated_link"]
                end = self.comm.network.occupy(link, self.launch_us, self.args["emulated_s"])
                hold(rec, (end - rec.now_us()) / 1e6, "wait", link=link)
                self.completed_us = max(end, self.completed_us or 0.0)
            if self.launch_event is not None:  # the device's times come when the step ends
                clock = self.comm.clock
                clock.pending.append(Timed(self.args["group"], self.launch_event, self.work, clock.mark(), self.record))
            self.comm.flight.done(self.args)
            # the work owns the backend's buffers, and the future's callback below holds this handle:
            # let go of it now, or the buffers live until Python's garbage collector breaks the cycle
            self.work = None
            self._release_staged()
            if self.args["op"] == "recv":  # the flow from the matching send ends inside this wait
                rec.flow("f", self.args["flow"], "wait", rec.now_us(), "p2p")
        self._waited = True
        if self.launch_event is None:
            self._mark_done(rec.now_us())
            self.record(self.launch_us, self.completed_us if self.completed_us is not None else rec.now_us())

    def record(self, start: float, end: float) -> None:
        record(self.comm.recorder, self.name, self.cat, self.args, self.n, start, end, self.blocking)


class Communicator:
    """Traced collectives over the process groups of one rank.

    `step` is set by the training loop so that every record (and every flow id) carries it.
    """

    def __init__(self, groups: ProcessGroups, recorder: TraceRecorder,
                 memory: MemoryTracker | None = None, clock: DeviceClock | None = None,
                 network: EmulatedNetwork | None = None) -> None:
        self.groups = groups
        self.network = network  # the emulated links, if any
        self.recorder = recorder
        self.memory = memory
        self.clock = clock  # CUDA: operations timed on the device
        self.flight = FlightRecorder()
        self.rank = groups.rank
        self.step = 0
        self._seq: dict[str, int] = defaultdict(int)
        #: gloo copies a reduce-scatter's input (see the module's docstring)
        self.backend_copies = dist.is_initialized() and dist.get_backend() == "gloo"
        self._p2p_seq: dict[tuple[str, int, int, int], int] = defaultdict(int)

    # ---- bookkeeping -------------------------------------------------------------------------
    def start_step(self, step: int) -> None:
        self.step = step
        if self.clock is not None:
            self.clock.start_step()

    def end_step(self) -> None:
        """CUDA: write the step's operations with their device times."""
        if self.clock is not None:
            self.clock.end_step()

    def size(self, group: str) -> int:
        return self.groups.size(group)

    def _args(self, op: str, group: str, tensor: torch.Tensor, total_bytes: int, **extra: Any) -> dict[str, Any]:
        self._seq[group] += 1
        return {"op": op, "group": group, "group_ranks": self.groups.ranks[group], "seq": self._seq[group],
                "step": self.step, "bytes": total_bytes, "dtype": str(tensor.dtype).replace("torch.", ""), **extra}

    def error(self, args: dict[str, Any], e: BaseException) -> CommError:
        op = f"{args['op']} {args['label']}" if args.get("label") else args["op"]
        where = f"{op} on group {args['group']} {args['group_ranks']}"
        if "seq" in args:
            where += f" (seq {args['seq']}, step {args['step']}, {args['bytes']} bytes)"
        if "peer" in args:
            where += f" with peer rank {args['peer']}"
        hint = ""
        if "timed out" in str(e).lower():
            hint = (" — a peer did not reach this operation within the process-group timeout "
                    "(RunConfig.timeout_s): it is stuck or slower than the timeout allows")
        return CommError(f"rank {self.rank}: {where} failed{hint}: {type(e).__name__}: {e}")

    def _run(self, args: dict[str, Any], fn: Any, async_op: bool, n: int, label: str | None = None,
             staged: int = 0) -> Handle | None:
        cat = "p2p" if args["op"] in ("send", "recv") else "collective"
        name = args["op"] if label is None else f"{args['op']} {label}"
        if label is not None:
            args["label"] = label
        rec = self.recorder
        self.flight.start(args)
        if self.network is not None:
            args.update(emulate(self.network, self.rank, args))
        if async_op or self.clock is not None:  # on CUDA even a blocking call is timed by the device
            event = self.clock.mark() if self.clock is not None else None
            launch = rec.now_us()
            with rec.span(f"launch {name}", cat, "comm", **{**args, "async": async_op}):
                if args["op"] == "send":  # held on the emulated link, then the flow to the receive starts
                    hold(rec, args.get("emulated_s", 0.0), "comm", link=args.get("emulated_link"))
                    rec.flow("s", args["flow"], "comm", rec.now_us(), "p2p")
                try:
                    work = fn(True)
                except Exception as e:  # noqa: BLE001
                    raise self.error(args, e) from e
            handle = Handle(self, work, name, cat, args, launch, n, staged, launch_event=event,
                            blocking=not async_op)
            if async_op:
                return handle
            handle.wait()  # the caller's stream waits for it; the host does not
            return None
        start = rec.now_us()
        try:
            fn(False)
        except Exception as e:  # noqa: BLE001
            raise self.error(args, e) from e
        hold(rec, args.get("emulated_s", 0.0), "comm", link=args.get("emulated_link"))
        self.flight.done(args)
        record(rec, name, cat, args, n, start, rec.now_us(), blocking=True)
        return None

    # ---- collectives -------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, group: str = "dp", async_op: bool = False,
                   label: str | None = None, reduce_op: str = "sum",
                   meta: dict[str, Any] | None = None) -> Handle | None:
        """Reduce `tensor` in place over `group` (sum, or max) with the backend's algorithm (our own
        send/recv ring is `comm.ring_allreduce.ring_all_reduce`). `meta` adds keys to the record."""
        n = self.size(group)
        args = self._args("all_reduce", group, tensor, nbytes(tensor), algorithm="backend", **(meta or {}))
        if reduce_op != "sum":
            args["reduce_op"] = reduce_op
        rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[reduce_op]
        pg = self.groups.groups[group]
        return self._run(args, lambda a: dist.all_reduce(tensor, op=rop, group=pg, async_op=a), async_op, n, label)

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, group: str = "dp",
                       async_op: bool = False, label: str | None = None,
                       meta: dict[str, Any] | None = None) -> Handle | None:
        """Sum `input` (n equal shards, concatenated on dim 0) over `group`; this rank keeps its shard."""
        n = self.size(group)
        args = self._args("reduce_scatter", group, input, nbytes(input), **(meta or {}))
        pg = self.groups.groups[group]
        out, inp = output.view(-1), input.reshape(-1)  # flat buffers: gloo needs them
        staged = nbytes(input) if self.backend_copies else 0
        return self._run(args, lambda a: _reduce_scatter(out, inp, group=pg, async_op=a), async_op, n, label, staged)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, group: str = "dp",
                   async_op: bool = False, label: str | None = None,
                   meta: dict[str, Any] | None = None) -> Handle | None:
        """Concatenate every rank's `input` (equal sizes) on dim 0 into `output` on every rank."""
        n = self.size(group)
        args = self._args("all_gather", group, output, nbytes(output), **(meta or {}))
        pg = self.groups.groups[group]
        out, inp = output.view(-1), input.reshape(-1)  # flat buffers: gloo needs them
        return self._run(args, lambda a: _all_gather(out, inp, group=pg, async_op=a), async_op, n, label)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, group: str = "dp", label: str | None = None,
                   meta: dict[str, Any] | None = None) -> None:
        """Block r of every rank's `input` (n equal blocks) goes to rank r: `output` holds them in rank order."""
        args = self._args("all_to_all", group, input, nbytes(input), **(meta or {}))
        pg = self.groups.groups[group]
        fn = lambda a: dist.all_to_all_single(output.view(-1), input.reshape(-1), group=pg, async_op=a)  # noqa: E731
        self._run(args, fn, False, self.size(group), label)

    def broadcast(self, tensor: torch.Tensor, src: int, group: str = "world", async_op: bool = False,
                  label: str | None = None) -> Handle | None:
        """Copy `tensor` from global rank `src` to every member of `group`."""
        n = self.size(group)
        args = self._args("broadcast", group, tensor, nbytes(tensor), peer=src)
        pg = self.groups.groups[group]
        return self._run(args, lambda a: dist.broadcast(tensor, src=src, group=pg, async_op=a), async_op, n, label)

    def barrier(self, group: str = "world") -> None:
        pg = self.groups.groups[group]
        args = {"op": "barrier", "group": group, "group_ranks": self.groups.ranks[group], "step": self.step}
        try:
            dist.barrier(group=pg)
        except Exception as e:  # noqa: BLE001
            raise self.error(args, e) from e

    # ---- point to point ----------------------------------------------------------------------
    def _p2p_args(self, op: str, tensor: torch.Tensor, peer: int, group: str, tag: int = 0) -> dict[str, Any]:
        src, dst = (self.rank, peer) if op == "send" else (peer, self.rank)
        self._p2p_seq[(group, src, dst, tag)] += 1
        seq = self._p2p_seq[(group, src, dst, tag)]
        return {"op": op, "group": group, "group_ranks": self.groups.ranks[group], "seq": seq,
                "step": self.step, "peer": peer, "bytes": nbytes(tensor),
                "dtype": str(tensor.dtype).replace("torch.", ""),
                "tag": tag,
                "flow": flow_id("p2p", self.step, group, tuple(self.groups.ranks[group]), tag, seq, src, dst)}

    def send(self, tensor: torch.Tensor, dst: int, group: str = "pp", label: str | None = None) -> None:
        self.isend(tensor, dst, group, label).wait()

    def recv(self, tensor: torch.Tensor, src: int, group: str = "pp", label: str | None = None) -> None:
        self.irecv(tensor, src, group, label).wait()

    def isend(self, tensor: torch.Tensor, dst: int, group: str = "pp", label: str | None = None,
              tag: int = 0) -> Handle:
        """Send to global rank `dst`; the flow to the matching receive starts at the launch. Transfers
        between the same two ranks are matched in order within each `tag`."""
        args = self._p2p_args("send", tensor, dst, group, tag)
        pg = self.groups.groups[group]
        return self._run(args, lambda a: dist.isend(tensor, dst, group=pg, tag=tag), True, 2, label)

    def irecv(self, tensor: torch.Tensor, src: int, group: str = "pp", label: str | None = None,
              tag: int = 0) -> Handle:
        """Receive from global rank `src`; the flow ends when the receive is waited for."""
        args = self._p2p_args("recv", tensor, src, group, tag)
        pg = self.groups.groups[group]
        return self._run(args, lambda a: dist.irecv(tensor, src, group=pg, tag=tag), True, 2, label)
