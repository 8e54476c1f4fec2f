"""An operation in flight — one collective, or a batch of point-to-point transfers posted together — and
what waiting for it records.

`Handle.wait()` is the one place a rank blocks on communication, on either backend:

- it is a span on the `wait` lane: the time this rank could not go on (a pipeline's bubble, a straggling
  peer, a transfer still on the wire);
- on gloo, `Work.wait()` blocks; on CUDA it only orders the streams, so the device clock blocks the host
  until the operation is done, with the operation's deadline (comm/device_timing.py);
- the backend's `Work` objects are let go at the wait (they hold the operation's tensors), keeping only
  the events that time it;
- each operation's record (one per operation: a collective, or each transfer of a batch) is written
  from its launch to its completion — at the wait on gloo (the completion time from the backend's
  future where it has one), at the step's end on CUDA (device times);
- a failure or a timeout becomes `CommError` naming the rank, the operation, its group and sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.comm.device_timing import Timed
from workbench.comm.emulated_link import hold
from workbench.trace.bandwidth import record


@dataclass(kw_only=True)
class Op:
    """One recorded operation: its record's name, category (collective or p2p), args and group size."""

    name: str
    cat: str
    args: dict[str, Any]
    n: int


class Handle:
    """What a non-blocking call returns. `wait()` blocks, records the blocked time, and lets the work go."""

    def __init__(
        self,
        comm: Any,
        works: list[Any],
        ops: list[Op],
        *,
        launch_us: float,
        staged: int = 0,
        timed: Timed | None = None,
        blocking: bool = False,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        """`comm`: the Communicator (comm/traced.py) that launched the operation; `on_done`: what finishes
        it once its works are done (a reduce-scatter done as an all-reduce keeps its slice there)."""
        self.comm, self.works, self.ops, self.launch_us = comm, works, ops, launch_us
        self.on_done = on_done
        self.timed, self.blocking = timed, blocking
        self.staged = staged  # the backend's own copy (comm_buffer)
        if self.staged:
            comm.memory.add("comm_buffer", self.staged)
        self.completed_us: float | None = None
        self._waited = False
        if timed is not None:
            return  # device-timed: the step's end writes the records
        rec = comm.recorder
        for work in works:  # collectives on gloo expose a future that completes with the work
            try:
                work.get_future().then(lambda _f: self._mark_done(rec.now_us()))
            except (RuntimeError, AttributeError):
                pass  # point-to-point work has no future on gloo: completion is known at wait()

    @property
    def waited(self) -> bool:
        return self._waited

    def finished(self) -> bool:
        """Whether every work is done, without blocking (the backend's `is_completed`)."""
        try:
            return all(work.is_completed() for work in self.works)
        except (RuntimeError, AttributeError):
            return False

    def _mark_done(self, ts: float) -> None:
        if self.completed_us is None:
            self.completed_us = ts

    def _release_staged(self) -> None:
        staged, self.staged = self.staged, 0
        if staged:
            self.comm.memory.add("comm_buffer", -staged)

    def wait(self) -> None:
        if self._waited:
            return
        comm, rec, first = self.comm, self.comm.recorder, self.ops[0]
        name = first.name if len(self.ops) == 1 else f"p2p batch of {len(self.ops)}"
        with rec.span(
            f"wait {name}",
            "wait",
            "wait",
            op=first.args["op"],
            group=first.args["group"],
            seq=first.args.get("seq"),
            step=comm.step,
        ):
            try:
                for work in self.works:
                    work.wait()
                # CUDA: block until the device has done it (or the deadline)
                if self.timed is not None:
                    comm.clock.waited(self.timed, self.works, self.launch_us + comm.timeout_s * 1e6)
            except Exception as e:  # re-raised with where it happened
                raise comm.error(first.args, e) from e
            # the emulated network's time
            if first.args.get("emulated_s") and first.cat == "collective":
                link = first.args["emulated_link"]
                end = comm.network.occupy(link, self.launch_us, first.args["emulated_s"])
                hold(rec, (end - rec.now_us()) / 1e6, "wait", link=link)
                self.completed_us = max(end, self.completed_us or 0.0)
            for op in self.ops:
                comm.flight.done(op.args)
            if self.on_done is not None:
                self.on_done()
                self.on_done = None
            # the works own the backend's buffers, and the futures' callbacks hold this handle: let go of
            # them now, or the buffers live until Python's garbage collector breaks the cycle
            self.works = []
            self._release_staged()
            for op in self.ops:
                if op.args["op"] == "recv":  # the flow from the matching send ends inside this wait
                    rec.flow("f", op.args["flow"], "wait", rec.now_us(), "p2p")
        self._waited = True
        if self.timed is None:
            self._mark_done(rec.now_us())
            end = self.completed_us if self.completed_us is not None else rec.now_us()
            for op in self.ops:
                record(
                    rec,
                    op.name,
                    op.cat,
                    op.args,
                    n=op.n,
                    start=self.launch_us,
                    end=end,
                    blocking=self.blocking,
                )


def device_record(rec: Any, op: Op, blocking: bool) -> Any:
    """What the device clock calls at the step's end to write `op` with its device times."""
    return lambda start, end: record(
        rec, op.name, op.cat, op.args, n=op.n, start=start, end=end, blocking=blocking
    )
