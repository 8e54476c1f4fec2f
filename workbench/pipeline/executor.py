"""Runs one rank's schedule — exactly the action list `build_schedule` produced and `validate` checked.

    RECV_F  post a receive of the stage input from the previous stage's rank, wait for it
    F       run the chunk forward (the last stage computes the loss, scaled by 1/m)
    SEND_F  post the output to the next stage's rank (asynchronous: waited for at the end of the step)
    RECV_B  receive the gradient of the output from the next stage
    B       backward through the chunk (with data parallelism, the last backward of each chunk lets
            its gradient buckets launch their all-reduces)
    SEND_B  post the gradient of the input to the previous stage

Point-to-point operations go through the traced Communicator on the `pp` group, so each send is
linked to its receive by a flow in the trace. A tag per (direction, receiving stage) keeps the
channels apart, so gloo matches every receive with its own send whatever the interleaving. Each action
is a span on the `schedule` lane (stage, chunk, microbatch); forwards and backwards also on `compute`.

Activations are counted per (stage, microbatch): added when its forward ends, released by its
backward, so the memory counter shows GPipe holding m microbatches and 1F1B at most p.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.comm.traced import Communicator, Handle
from workbench.engine.device import sync_compute
from workbench.engine.memory import MemoryTracker
from workbench.pipeline.schedule import Schedule


def tag(kind: str, stage: int) -> int:
    """The channel of a transfer: activations into `stage` or gradients into `stage`."""
    return 2 * stage + (0 if kind.endswith("_F") else 1)


class PipelineExecutor:
    def __init__(self, schedule: Schedule, rank: int, chunks: dict[int, nn.Module], comm: Communicator,
                 memory: MemoryTracker, hidden_shape: tuple[int, ...], device: torch.device,
                 grad_sync: Any = None, dtype: torch.dtype = torch.float32) -> None:
        self.schedule, self.rank, self.chunks, self.comm = schedule, rank, chunks, comm
        self.memory, self.hidden_shape, self.device, self.grad_sync = memory, hidden_shape, device, grad_sync
        self.dtype = dtype  # of the activations and gradients that travel between stages
        self.actions = schedule.actions[rank]
        self.loss_scale = 1.0  # fp16: the backward runs on loss × scale
        self.pp_ranks = comm.groups.ranks["pp"]
        last_b: dict[int, int] = {}
        for i, a in enumerate(self.actions):
            if a.kind == "B":
                last_b[a.stage] = i
        self.last_backward = set(last_b.values())

    def _peer(self, stage: int) -> int:
        return self.pp_ranks[self.schedule.rank_of(stage)]

    def run(self, inputs: list[torch.Tensor], targets: list[torch.Tensor], step: int) -> torch.Tensor:
        """One optimizer step's forwards and backwards; returns the summed (1/m-scaled) loss of the
        microbatches whose last stage is here (zero elsewhere)."""
        rec, m = self.comm.recorder, self.schedule.m
        stage_in: dict[tuple[int, int], torch.Tensor] = {}
        stage_out: dict[tuple[int, int], torch.Tensor] = {}
        grad_out: dict[tuple[int, int], torch.Tensor] = {}
        act_bytes: dict[tuple[int, int], int] = {}
        sends: list[Handle] = []
        loss_sum = torch.zeros((), device=self.device)
        if self.grad_sync is not None:
            self.grad_sync.enabled = False
        for i, a in enumerate(self.actions):
            key = (a.stage, a.microbatch)
            args = {"step": step, "stage": a.stage, "chunk": self.schedule.chunk_of(a.stage),
                    "microbatch": a.microbatch, "action": a.kind}
            with rec.span(str(a), "schedule", "schedule", **args):
                if a.kind == "RECV_F":
                    buf = torch.empty(self.hidden_shape, device=self.device, dtype=self.dtype)
                    self.comm.irecv(buf, self._peer(a.peer), "pp", label=str(a), tag=tag(a.kind, a.stage)).wait()
                    stage_in[key] = buf.requires_grad_()
                elif a.kind == "F":
                    chunk = self.chunks[a.stage]
                    x = stage_in[key] if key in stage_in else inputs[a.microbatch]
                    before = self.memory.current["activation"]
                    with rec.span("forward", "forward", "compute", **args):
                        with self.memory.count_saved_activations():
                            out = chunk(x, targets[a.microbatch] if chunk.last else None)
                            if chunk.last:
                                out = out / m
                        sync_compute(self.device)
                    act_bytes[key] = self.memory.current["activation"] - before
                    self.memory.snapshot()
                    stage_out[key] = out
                    if chunk.last:
                        loss_sum = loss_sum + out.detach()
                elif a.kind == "SEND_F":
                    out = stage_out[key].detach()
                    sends.append(self.comm.isend(out, self._peer(a.peer), "pp", label=str(a),
                                                 tag=tag(a.kind, a.peer)))
                elif a.kind == "RECV_B":
                    buf = torch.empty(self.hidden_shape, device=self.device, dtype=self.dtype)
                    self.comm.irecv(buf, self._peer(a.peer), "pp", label=str(a), tag=tag(a.kind, a.stage)).wait()
                    grad_out[key] = buf
                elif a.kind == "B":
                    if self.grad_sync is not None:  # sync gradients only on this chunk's last backward
                        self.grad_sync.enabled = i in self.last_backward
                    with rec.span("backward", "backward", "compute", **args):
                        out = stage_out.pop(key)
                        if key in grad_out:
                            torch.autograd.backward(out, grad_out.pop(key))
                        else:
                            (out * self.loss_scale if self.loss_scale != 1.0 else out).backward()
                        sync_compute(self.device)
                    self.memory.add("activation", -act_bytes.pop(key))
                    self.memory.snapshot()
                elif a.kind == "SEND_B":
                    grad = stage_in.pop(key).grad
                    sends.append(self.comm.isend(grad, self._peer(a.peer), "pp", label=str(a),
                                                 tag=tag(a.kind, a.peer)))
        for handle in sends:
            handle.wait()
        if self.grad_sync is not None:
            self.grad_sync.enabled = True
        return loss_sum

