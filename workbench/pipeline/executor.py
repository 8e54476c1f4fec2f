"""Runs one rank's schedule — exactly the program `Schedule.program(rank)` gives, which `validate` checked
(on the CPU with each batch's receives posted one batch early: below).

    P2P batch   post the round's transfers (batch_isend_irecv, no tags): sends of what this rank
                computed, receives of what its neighbours computed for it; nothing is waited for here.
                On CUDA (NCCL) the batch is posted together, as `validate` checked it. On the CPU (gloo)
                its receives are posted one batch early, after the previous batch's sends (`launch_plan`)
    F           wait for the batch that brought its input, then run the chunk forward (the last stage
                computes the loss, scaled by 1/m)
    B           wait for the batch that brought the output's gradient, then backward through the chunk
                (the earlier backwards of a chunk run inside the gradient sync's `no_sync()`, so only its
                last one lets the buckets launch their all-reduces)
    I, W        B split (weight_grad.py): I as B, but each Linear stashes its input and output gradient
                instead of computing its weight gradient; W computes them from the stash. The chunk's
                last I and last W both run outside `no_sync()`: I completes the layer norms' gradients,
                W the Linears', so each bucket launches once all of its gradients are in
    (a V)       two stages on this rank hand the activation (and, backward, its gradient) over in memory
    F&B         DualPipe's pair (schedules/actions.py): its F then its B, one after the other — both inputs
                were received before it, both outputs are sent after it; on a GPU the two would overlap
                each other's communication, a CPU thread runs them in turn (torch's runtime does the same
                without a custom overlap function). Each carries `pair` in its span's args
    (step end)  wait for every batch still in flight

Why gloo's receives go early: gloo moves a message only once both ends are posted, and the end posted
second starts it. A receive posted when its input is needed — after the peer's send, on the rank that is
behind — waits for the peer's gloo thread to wake and write, which on a busy CPU takes a scheduler slice,
on the critical path (ZBV on 2 ranks, `small`: ~2 ms at each such post of rank 0, 10–20 ms a step; torch's
runtime posts its receives early too). Posted one batch ahead, the receive is usually there before the
send, whose own thread then writes at once. It changes no matching — each peer's receives are still
posted in program order, and gloo matches transfers between two ranks in the order posted — and cannot
block anything: a posted receive waits for nothing, and every wait happens where it did, no later. NCCL
has no such round trip on the host, and a receive posted early there would hold the peer pair's stream,
so CUDA runs post exactly the validated batches.

A rank blocks only where it needs data: each wait is a span on the `wait` lane (a pipeline's bubble, as
the clock saw it, on gloo and on CUDA alike: comm/handle.py). Point-to-point operations go through the
traced Communicator on the `pp` group, so each send is linked to its receive by a flow in the trace. Each
program item is a span on the `schedule` lane (stage, chunk, microbatch; a batch lists its transfers);
forwards and backwards are also on `compute`.

Activations are counted as each forward saves them and released as its backward consumes them
(measure/memory.py), so the memory counter shows GPipe holding m microbatches and 1F1B at most p.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from workbench.comm.traced import Communicator, Handle
from workbench.measure.memory import MemoryTracker
from workbench.parallel.flat import grad_of
from workbench.parallel.grad_sync import GradSync
from workbench.pipeline.weight_grad import WeightGradStore, split_linears
from workbench.schedules.actions import Action, P2PBatch, Schedule
from workbench.trace.recorder import TraceRecorder


class PipelineExecutor:
    """One rank's `ForwardBackward` under a schedule. Owns the step's transfers and the zero-bubble stash;
    is handed the schedule, this rank's pp index and chunks, the communicator (the `pp` group's transfers),
    the recorder (the schedule's and compute's spans), the memory tracker, the shape, device and dtype of
    what travels between stages, and the grad sync whose `no_sync()` holds the earlier backwards."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        chunks: dict[int, nn.Module],
        comm: Communicator,
        *,
        recorder: TraceRecorder,
        memory: MemoryTracker,
        hidden_shape: tuple[int, ...],
        device: torch.device,
        grad_sync: GradSync | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.schedule, self.rank, self.chunks, self.comm = schedule, rank, chunks, comm
        self.recorder, self.memory, self.grad_sync = recorder, memory, grad_sync
        self.hidden_shape, self.device = hidden_shape, device
        self.dtype = dtype  # of the activations and gradients that travel between stages
        self.program = schedule.program(rank)
        # gloo's receives are posted a batch early (the module's docstring); NCCL's batches as validated
        self.receives_ahead = device.type == "cpu"
        self.launches = launch_plan(self.program, receives_ahead=self.receives_ahead)
        self.pp_ranks = comm.members("pp")
        self.last_backward = last_contributions(self.program)
        self.forward_program: list | None = None  # the validation loss's: built at its first use
        self.forward_launches: dict[int, list[tuple[Action, ...]]] = {}
        self.store = WeightGradStore(memory)
        # backward split
        self.split = {(a.stage, a.microbatch) for a in schedule.actions[rank] if a.kind == "I"}
        if self.split:
            for chunk in chunks.values():
                split_linears(chunk, self.store)

    def _peer(self, stage: int) -> int:
        return self.pp_ranks[self.schedule.rank_of(stage)]

    def run(
        self, x: torch.Tensor, y: torch.Tensor, step: int, loss_scale: float = 1.0
    ) -> torch.Tensor:
        """One optimizer step's forwards and backwards of the local batch (x, y), cut into m microbatches;
        backward runs on loss × loss_scale (fp16). Returns the summed (1/m-scaled) loss of the
        microbatches whose last stage is here (zero elsewhere)."""
        # each microbatch a tensor of its own, so a forward keeps only its own ids alive
        inputs, targets = ([t.clone() for t in z.chunk(self.schedule.m)] for z in (x, y))
        st = _StepState(
            inputs=inputs,
            targets=targets,
            loss_scale=loss_scale,
            loss_sum=torch.zeros((), device=self.device),
        )
        rec = self.recorder
        for i, item in enumerate(self.program):
            if isinstance(item, P2PBatch):
                with rec.span(
                    str(item),
                    "schedule",
                    "schedule",
                    step=step,
                    action="P2P",
                    transfers=[str(a) for a in item.actions],
                    posted=[[str(a) for a in group] for group in self.launches[i]],
                ):
                    for group in self.launches[i]:
                        self._post(st, group)
                continue
            key = (item.stage, item.microbatch)
            if item.kind != "W":
                # outside the action: a `wait` span
                self._await(st, ("F" if item.kind == "F" else "B", key))
            args = {
                "step": step,
                "stage": item.stage,
                "chunk": self.schedule.chunk_of(item.stage),
                "microbatch": item.microbatch,
                "action": item.kind,
            }
            if item.pair is not None:  # an F&B pair: issued with the next (or the previous) action
                args["pair"] = item.pair
            run = {"F": self._forward, "W": self._weight}.get(item.kind, self._backward)
            with rec.span(str(item), "schedule", "schedule", **args):
                run(st, item, key, args, i)
        for handle, _ in st.posted:
            handle.wait()
        st.posted.clear()
        return st.loss_sum

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        """The forwards of the schedule alone (`Schedule.forward_only`: its F actions and their transfers,
        in the same order), for the validation loss; the caller holds torch.no_grad. Returns what `run`
        returns: the summed 1/m-scaled loss where the last stage is, zero elsewhere."""
        if self.forward_program is None:
            self.forward_program = self.schedule.forward_only().program(self.rank)
            self.forward_launches = launch_plan(
                self.forward_program, receives_ahead=self.receives_ahead
            )
        inputs, targets = ([t.clone() for t in z.chunk(self.schedule.m)] for z in (x, y))
        st = _StepState(
            inputs=inputs,
            targets=targets,
            loss_scale=1.0,
            loss_sum=torch.zeros((), device=self.device),
        )
        rec = self.recorder
        for i, item in enumerate(self.forward_program):
            if isinstance(item, P2PBatch):
                for group in self.forward_launches[i]:
                    self._post(st, group)
                continue
            key = (item.stage, item.microbatch)
            self._await(st, ("F", key))
            args = {
                "step": step,
                "stage": item.stage,
                "chunk": self.schedule.chunk_of(item.stage),
                "microbatch": item.microbatch,
                "action": "F",
                "evaluation": True,
            }
            with rec.span(str(item), "schedule", "schedule", **args):
                self._forward(st, item, key, args, i)
        for handle, _ in st.posted:
            handle.wait()
        st.posted.clear()
        return st.loss_sum

    # ---- transfers ---------------------------------------------------------------------------------
    def _post(self, st: _StepState, actions: tuple[Action, ...]) -> None:
        """Post these transfers together; remember which of the handles brings each received tensor."""
        transfers: list[tuple[str, torch.Tensor, int, str | None]] = []
        keep = []
        for a in actions:
            key = (a.stage, a.microbatch)
            if a.is_recv:
                buf = torch.empty(self.hidden_shape, device=self.device, dtype=self.dtype)
                (st.stage_in if a.kind == "RECV_F" else st.grad_out)[key] = buf
                transfers.append(("recv", buf, self._peer(a.peer_stage), str(a)))
            else:
                t = (
                    st.stage_out[key].detach()
                    if a.kind == "SEND_F"
                    else grad_of(st.stage_in.pop(key))
                )
                transfers.append(("send", t, self._peer(a.peer_stage), str(a)))
            keep.append(transfers[-1][1])
        handle = self.comm.batch_isend_irecv(transfers, "pp")
        for a in actions:
            if a.is_recv:
                st.arriving[(a.kind[-1], (a.stage, a.microbatch))] = handle
        st.posted.append((handle, keep))  # the tensors stay alive until the batch is done
        _let_go(st)

    def _await(self, st: _StepState, what: tuple[str, tuple[int, int]]) -> None:
        handle = st.arriving.pop(what, None)
        if handle is not None:
            handle.wait()
            if what[0] == "F":
                st.stage_in[what[1]].requires_grad_()
        _let_go(st)

    # ---- compute -----------------------------------------------------------------------------------
    def _forward(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        chunk = self.chunks[a.stage]
        x = st.stage_in[key] if key in st.stage_in else st.inputs[a.microbatch]
        with (
            self.recorder.span("forward", "forward", "compute", **args),
            self.store.forward(key in self.split),
        ):
            with self.memory.count_saved_activations():
                out = chunk(x, st.targets[a.microbatch] if chunk.last else None)
                if chunk.last:
                    out = out / self.schedule.m
            self.recorder.sync_compute()
        self.memory.snapshot()
        st.stage_out[key] = out
        if chunk.last:
            st.loss_sum = st.loss_sum + out.detach()
        elif (nxt := self.schedule.next_stage(a.stage)) is not None and self.schedule.local(
            a.stage, nxt
        ):  # a V's turn: the next stage is here too
            st.stage_in[(nxt, a.microbatch)] = out.detach().requires_grad_()

    def _backward(
        self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int
    ) -> None:
        """B, or I (the same, with each Linear's weight gradient left to W)."""
        name = "backward" if a.kind == "B" else "backward_input"
        with (
            self._sync_unless_last(i),
            self.recorder.span(name, "backward", "compute", **args),
            self.store.input_grad(key) if a.kind == "I" else nullcontext(),
        ):
            out = st.stage_out.pop(key)
            if key in st.grad_out:
                torch.autograd.backward(out, st.grad_out.pop(key))
            else:
                (out * st.loss_scale if st.loss_scale != 1.0 else out).backward()
            self.recorder.sync_compute()
        # a V's turn: hand the gradient over
        prev = self.schedule.prev_stage(a.stage)
        if prev is not None and self.schedule.local(prev, a.stage):
            st.grad_out[(prev, a.microbatch)] = grad_of(st.stage_in.pop(key))
        self.memory.snapshot()

    def _weight(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        """W: the weight gradients of the Linears that this microbatch's I left in the stash."""
        with (
            self._sync_unless_last(i),
            self.recorder.span("backward_weight", "backward", "compute", **args),
        ):
            self.store.weight_grad(key)
            self.recorder.sync_compute()
        self.memory.snapshot()

    def _sync_unless_last(self, i: int) -> Any:
        """Gradients are synchronised only from a chunk's last backward (B, I or W) on."""
        if self.grad_sync is None or i in self.last_backward:
            return nullcontext()
        return self.grad_sync.no_sync()


@dataclass(kw_only=True)
class _StepState:
    """What one step's program hands from item to item: stage inputs and outputs by (stage, microbatch),
    the gradients received, the batches that bring them, and every batch in flight."""

    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    loss_scale: float
    loss_sum: torch.Tensor
    stage_in: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    stage_out: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    grad_out: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    arriving: dict[tuple[str, tuple[int, int]], Handle] = field(default_factory=dict)
    posted: list[tuple[Handle, list[torch.Tensor]]] = field(default_factory=list)


def last_contributions(program: list) -> set[int]:
    """The program positions after which a chunk's gradients are complete, where the gradient sync may
    launch: per stage, the last of its B and I passes (the layer norms' and embeddings' last gradient)
    and the last of its B and W passes (the Linears'). A stage that runs B for some microbatches and
    I/W for later ones (DualPipe's tail, ZBV) launches at its last I and last W, not at its last B."""
    last: dict[tuple[int, str], int] = {}  # (stage, "I" or "W") → the last position contributing
    for i, item in enumerate(program):
        if isinstance(item, Action) and item.kind != "F":
            for part in ("I", "W") if item.kind == "B" else (item.kind,):
                last[(item.stage, part)] = i
    return set(last.values())


def launch_plan(
    program: list[Action | P2PBatch], *, receives_ahead: bool
) -> dict[int, list[tuple[Action, ...]]]:
    """What to post at each P2P batch of `program` (its index → the groups, each one batch_isend_irecv).
    Without `receives_ahead`: the batch itself. With it: the first batch's receives, then each batch's
    sends, then the next batch's receives — every receive one batch early, each peer's in program order."""
    batches = [(i, item) for i, item in enumerate(program) if isinstance(item, P2PBatch)]
    if not receives_ahead:
        return {i: [b.actions] for i, b in batches}
    plan: dict[int, list[tuple[Action, ...]]] = {}
    for n, (i, b) in enumerate(batches):
        sends = tuple(a for a in b.actions if not a.is_recv)
        now = tuple(a for a in b.actions if a.is_recv) if n == 0 else ()
        ahead = (
            tuple(a for a in batches[n + 1][1].actions if a.is_recv) if n + 1 < len(batches) else ()
        )
        plan[i] = [group for group in (now, sends, ahead) if group]
    return plan


def _let_go(st: _StepState) -> None:
    """Drop the batches that are done (waited for, or finished on their own: a batch of sends), and with
    them the tensors they sent: a send's activation is not kept to the step's end."""
    for entry in list(st.posted):
        handle = entry[0]
        if handle.waited or handle.finished():
            handle.wait()
            st.posted.remove(entry)
