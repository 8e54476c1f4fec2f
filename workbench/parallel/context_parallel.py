"""Context parallelism in the engine: the sequence of every sample split over the `cp` group, attention
as a ring over it (parallel/ring_attention.py; Liu et al. 2023, "Ring Attention"; Megatron-LM's and
torch's context parallelism for the head-tail balance).

**What is sharded.** Activations, by sequence: each of the cp ranks holds s/cp tokens of every sample of
its data-parallel share (`balance="head-tail"`: chunks r and 2cp − 1 − r of 2·cp; `"none"`: the r-th
contiguous cp-th), their token and position embeddings (`GPT.positions`), their targets and their part
of the loss. Parameters are not sharded: every cp rank holds them whole, and their gradients are reduced
over dp×cp (the `dp_cp` group, config/grid.py), as Megatron-LM and torch do.

**Collectives.** Forward, per attention layer: cp − 1 ring steps, each passing this rank's current K/V
block (2·b·heads·s/cp·d values) to the next rank with `batch_isend_irecv` over the `cp` group while it
computes against the block it holds (`rotate="allgather"`: one all-gather of every rank's K/V instead).
Backward: cp − 1 steps carrying the K/V block and its dK/dV beside it, and one last step bringing dK/dV
home (all-gather: one reduce-scatter of dK/dV). Nothing else: MLPs, layer norms and the head are
per-token.

**Traced.** Each ring step of forward and backward is a span of category `cp_ring` on the `ring` lane,
with the layer, the step, the block's owner, the bytes it sent and the unmasked query-key pairs it
computed: each rank's share of the attention work is in its trace (`cp_pairs` per layer in the trace's
`workbench` block), so an imbalance is visible (torch PR 189902 found a balancer imbalanced while its
numbers stayed correct).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workbench.comm.traced import Communicator
from workbench.parallel.ring_attention import Ring, positions, ring_attention, shard, unmasked_pairs
from workbench.trace.recorder import TraceRecorder


class ContextParallel:
    """One rank's place in its context-parallel group, and its ring attention over it. Is handed the
    communicator (the `cp` group's transfers and collectives) and the recorder (each ring step's span)."""

    def __init__(
        self,
        comm: Communicator,
        *,
        recorder: TraceRecorder,
        seq_len: int,
        balance: str = "head-tail",
        rotate: str = "ring",
    ) -> None:
        self.comm, self.recorder, self.balance, self.rotate = comm, recorder, balance, rotate
        self.members = comm.members("cp")
        self.size, self.index = len(self.members), comm.index("cp")
        self.pos = [positions(seq_len, r, self.size, balance) for r in range(self.size)]
        self._device_pos: dict[
            torch.device, list[torch.Tensor]
        ] = {}  # the same, copied once per device
        #: unmasked query-key pairs this rank computed per attention layer (the last forward's), the work
        self.pairs: dict[str, int] = {}

    @property
    def local_positions(self) -> torch.Tensor:
        """The global positions of this rank's tokens, in its local order."""
        return self.pos[self.index]

    def shard(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a (b, s, ...) tensor (inputs, targets)."""
        return shard(x, self.index, self.size, self.balance, dim=1)

    def attention(
        self, layer: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Causal attention of this rank's (b, heads, s/cp, d) queries against the whole sequence's keys and
        values, returned as (b, heads, s/cp, d)."""
        # once per run: the causal masks are built on the device from these
        if q.device not in self._device_pos:
            self._device_pos[q.device] = [p.to(q.device) for p in self.pos]
        ring = Ring(
            rank=self.index,
            size=self.size,
            pos=self.pos,
            exchange=self._exchange(layer),
            gather=self._gather(layer),
            scatter_sum=self._scatter_sum(layer),
            device_pos=self._device_pos[q.device],
        )
        out = ring_attention(q, k, v, ring, self.rotate)
        self.pairs[layer] = ring.pairs
        return out

    # ---- the ring's communication, traced -------------------------------------------------------------
    def _exchange(
        self, layer: str
    ) -> Callable[[list[torch.Tensor]], Callable[[], list[torch.Tensor]]]:
        """Ring steps: send to the next cp rank, receive from the previous one, posted together; each a
        `cp_ring` span from its posting to the wait that ends it."""
        calls = [0]  # a ring's first cp − 1 exchanges are its forward's, the next cp its backward's
        nxt, prv = (
            self.members[(self.index + 1) % self.size],
            self.members[(self.index - 1) % self.size],
        )

        def exchange(tensors: list[torch.Tensor]) -> Callable[[], list[torch.Tensor]]:
            calls[0] += 1
            phase = "forward" if calls[0] < self.size else "backward"
            i = calls[0] if phase == "forward" else calls[0] - self.size + 1
            # whose block this rank computed on before passing it
            held = (self.index - i + 1) % self.size
            sent = sum(t.numel() * t.element_size() for t in tensors)
            span = self.recorder.span(
                f"cp ring step {i} {phase}",
                "cp_ring",
                "ring",
                step=self.comm.step,
                layer=layer,
                phase=phase,
                ring_step=i,
                group="cp",
                peer=nxt,
                recv_peer=prv,
                bytes=sent,
                block_of=held,
                pairs=unmasked_pairs(self.local_positions, self.pos[held]),
            )
            span.__enter__()
            received = [torch.empty_like(t) for t in tensors]
            handle = self.comm.batch_isend_irecv(
                [
                    x
                    for t, r in zip(tensors, received, strict=True)
                    for x in (
                        ("send", t.contiguous(), nxt, f"cp {layer}"),
                        ("recv", r, prv, f"cp {layer}"),
                    )
                ],
                "cp",
            )

            def wait() -> list[torch.Tensor]:
                handle.wait()
                span.__exit__(None, None, None)
                return received

            return wait

        return exchange

    def _gather(self, layer: str) -> Callable[[torch.Tensor], list[torch.Tensor]]:
        def gather(t: torch.Tensor) -> list[torch.Tensor]:
            out = torch.empty((self.size, *t.shape), dtype=t.dtype, device=t.device)
            self.comm.all_gather(out, t, "cp", label=f"cp {layer} kv")
            return list(out.unbind(0))

        return gather

    def _scatter_sum(self, layer: str) -> Callable[[list[torch.Tensor]], torch.Tensor]:
        def scatter_sum(parts: list[torch.Tensor]) -> torch.Tensor:
            out = torch.empty_like(parts[0])
            self.comm.reduce_scatter(out, torch.stack(parts), "cp", label=f"cp {layer} dkv")
            return out

        return scatter_sum
