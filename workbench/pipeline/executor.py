"""Runs one rank's schedule — exactly the action list `build_schedule` produced and `validate` checked.

    RECV_F  post a receive of the stage input from the previous stage's rank, wait for it
    F       run the chunk forward (the last stage computes the loss, scaled by 1/m)
    SEND_F  post the output to the next stage's rank (asynchronous: waited for at the end of the step)
    RECV_B  receive the gradient of the output from the next stage
    B       backward through the chunk (the earlier backwards of a chunk run inside the gradient
            sync's `no_sync()`, so only its last one lets the buckets launch their all-reduces)
    SEND_B  post the gradient of the input to the previous stage

Point-to-point operations go through the traced Communicator on the `pp` group, so each send is
linked to its receive by a flow in the trace. A tag per (direction, receiving stage) keeps the
channels apart, so gloo matches every receive with its own send whatever the interleaving. Each action
is a span on the `schedule` lane (stage, chunk, microbatch); forwards and backwards also on `compute`.

Activations are counted as each forward saves them and released as its backward consumes them
(measure/memory.py), so the memory counter shows GPipe holding m microbatches and 1F1B at most p.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.comm.traced import Communicator, Handle
from workbench.measure.device import sync_compute
from workbench.measure.memory import MemoryTracker
from workbench.parallel.grad_sync import GradSync
from workbench.pipeline.schedule import Action, Schedule


def tag(kind: str, stage: int) -> int:
    """The channel of a transfer: activations into `stage` or gradients into `stage`."""
    return 2 * stage + (0 if kind.endswith("_F") else 1)


class PipelineExecutor:
    def __init__(self, schedule: Schedule, rank: int, chunks: dict[int, nn.Module], comm: Communicator,
                 memory: MemoryTracker, hidden_shape: tuple[int, ...], device: torch.device,
                 grad_sync: GradSync | None = None, dtype: torch.dtype = torch.float32) -> None:
        self.schedule, self.rank, self.chunks, self.comm = schedule, rank, chunks, comm
        self.memory, self.hidden_shape, self.device, self.grad_sync = memory, hidden_shape, device, grad_sync
        self.dtype = dtype  # of the activations and gradients that travel between stages
        self.actions = schedule.actions[rank]
        self.pp_ranks = comm.groups.ranks["pp"]
        last_b: dict[int, int] = {}
        for i, a in enumerate(self.actions):
            if a.kind == "B":
                last_b[a.stage] = i
        self.last_backward = set(last_b.values())

    def _peer(self, stage: int) -> int:
        return self.pp_ranks[self.schedule.rank_of(stage)]

    def run(self, x: torch.Tensor, y: torch.Tensor, step: int, loss_scale: float = 1.0) -> torch.Tensor:
        """One optimizer step's forwards and backwards of the local batch (x, y), cut into m microbatches;
        backward runs on loss × loss_scale (fp16). Returns the summed (1/m-scaled) loss of the
        microbatches whose last stage is here (zero elsewhere)."""
        # each microbatch a tensor of its own, so a forward keeps only its own ids alive
        inputs, targets = ([t.clone() for t in z.chunk(self.schedule.m)] for z in (x, y))
        st = _StepState(inputs, targets, loss_scale, torch.zeros((), device=self.device))
        handlers = {"RECV_F": self._recv_f, "F": self._forward, "SEND_F": self._send_f,
                    "RECV_B": self._recv_b, "B": self._backward, "SEND_B": self._send_b}
        for i, a in enumerate(self.actions):
            args = {"step": step, "stage": a.stage, "chunk": self.schedule.chunk_of(a.stage),
                    "microbatch": a.microbatch, "action": a.kind}
            with self.comm.recorder.span(str(a), "schedule", "schedule", **args):
                handlers[a.kind](st, a, (a.stage, a.microbatch), args, i)
        for handle in st.sends:
            handle.wait()
        return st.loss_sum

    def _receive(self, a: Action, key: tuple[int, int]) -> torch.Tensor:
        buf = torch.empty(self.hidden_shape, device=self.device, dtype=self.dtype)
        self.comm.irecv(buf, self._peer(a.peer), "pp", label=str(a), tag=tag(a.kind, a.stage)).wait()
        return buf

    def _send(self, st: _StepState, a: Action, t: torch.Tensor) -> None:
        st.sends.append(self.comm.isend(t, self._peer(a.peer), "pp", label=str(a), tag=tag(a.kind, a.peer)))

    def _recv_f(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        st.stage_in[key] = self._receive(a, key).requires_grad_()

    def _recv_b(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        st.grad_out[key] = self._receive(a, key)

    def _send_f(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        self._send(st, a, st.stage_out[key].detach())

    def _send_b(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        self._send(st, a, st.stage_in.pop(key).grad)

    def _forward(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        chunk = self.chunks[a.stage]
        x = st.stage_in[key] if key in st.stage_in else st.inputs[a.microbatch]
        with self.comm.recorder.span("forward", "forward", "compute", **args):
            with self.memory.count_saved_activations():
                out = chunk(x, st.targets[a.microbatch] if chunk.last else None)
                if chunk.last:
                    out = out / self.schedule.m
            sync_compute(self.device)
        self.memory.snapshot()
        st.stage_out[key] = out
        if chunk.last:
            st.loss_sum = st.loss_sum + out.detach()

    def _backward(self, st: _StepState, a: Action, key: tuple[int, int], args: dict, i: int) -> None:
        # gradients are synchronised only after this chunk's last backward
        hold = self.grad_sync is not None and i not in self.last_backward
        with self.grad_sync.no_sync() if hold else nullcontext(), \
                self.comm.recorder.span("backward", "backward", "compute", **args):
            out = st.stage_out.pop(key)
            if key in st.grad_out:
                torch.autograd.backward(out, st.grad_out.pop(key))
            else:
                (out * st.loss_scale if st.loss_scale != 1.0 else out).backward()
            sync_compute(self.device)
        self.memory.snapshot()


@dataclass
class _StepState:
    """What one step's actions hand each other: stage inputs and outputs by (stage, microbatch), the
    gradients received, the sends in flight."""

    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    loss_scale: float
    loss_sum: torch.Tensor
    stage_in: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    stage_out: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    grad_out: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    sends: list[Handle] = field(default_factory=list)
