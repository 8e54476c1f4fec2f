"""Expert parallelism (GShard, Lepikhin et al. 2020; DeepSpeed-MoE; torchtitan's and Megatron-LM's token
dispatchers): the E experts of every MoE layer (model/moe.py) sharded over an `ep` group carved from dp.

**What is sharded.** Expert weights: rank i of an ep group holds experts [i·E/ep, (i+1)·E/ep) of every layer
(`shard_experts` swaps in an `ExpertShard`, cut by index from the whole model's initial value, so every layout
starts alike). The router
and every dense weight stay whole. Expert gradients reduce over the ranks that hold the same experts — the
`edp` group, dp/ep of them — and dense ones over all of dp (`expert_params`, engine/parallelize.py).

**Collectives** per MoE layer, over the ep group. Forward: the tokens, in expert-major order, go to the
ranks holding their experts (all-to-all 1) and the experts' outputs come back (all-to-all 2); backward the
same two in reverse, carrying gradients. `dispatch="dropless"` (torchtitan, Megatron): variable splits, the
per-expert counts exchanged first by an all-to-all of E numbers; `"capacity"` (DeepSpeed): every expert
gets exactly C rows from every rank (the capacity, padded with zeros), so the all-to-alls have equal splits
and no count exchange — at the price of the padding's compute and bytes. Each all-to-all is traced with its
send and receive splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.comm.traced import Communicator
from workbench.model.moe import GroupedLinear
from workbench.parallel.param_facts import ParamTable


@dataclass(frozen=True, kw_only=True)
class _Splits:
    """One all-to-all's rows: `send[r]` go to ep rank r, `recv[r]` come from it; `label` names it in the trace."""

    send: list[int]
    recv: list[int]
    label: str


class _AllToAll(torch.autograd.Function):
    """Rows to ranks by `send` splits, received by `recv`; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator, splits: _Splits) -> torch.Tensor:
        ctx.comm, ctx.splits = comm, splits
        out = x.new_empty((sum(splits.recv), *x.shape[1:]))
        comm.all_to_all(
            out,
            x.contiguous(),
            "ep",
            label=f"{splits.label} forward",
            output_splits=splits.recv,
            input_splits=splits.send,
        )
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        splits: _Splits = ctx.splits
        out = grad.new_empty((sum(splits.send), *grad.shape[1:]))
        ctx.comm.all_to_all(
            out,
            grad.contiguous(),
            "ep",
            label=f"{splits.label} backward",
            output_splits=splits.send,
            input_splits=splits.recv,
        )
        return out, None, None


class ExpertShard(GroupedLinear):
    """One layer's stacked expert weights cut to this ep rank's E/ep experts [lo, hi): what `shard_experts`
    swaps in for a GroupedLinear. `full_shapes` and `shard_param` give initialisation and checkpoints the
    whole model's tensors by name (as tensor parallelism's modules do)."""

    def __init__(
        self,
        experts: int,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        index: int,
        size: int,
    ) -> None:
        per = experts // size
        super().__init__(per, in_features, out_features, bias)
        self.lo, self.hi = index * per, (index + 1) * per
        self.full_shapes = {
            "weight": (experts, out_features, in_features),
            "bias": (experts, out_features),
        }

    def shard_param(self, leaf: str, full: torch.Tensor) -> torch.Tensor:
        return full[self.lo : self.hi].clone()


def shard_experts(model: nn.Module, index: int, size: int) -> None:
    """Swap every MoE layer's stacked experts (model/moe.py's GroupedLinear) for this ep rank's E/ep of them
    (an `ExpertShard`, uninitialised, on the model's device: meta while building)."""
    for name, module in list(model.named_modules()):
        if isinstance(module, GroupedLinear) and not isinstance(module, ExpertShard):
            experts, out_features, in_features = module.weight.shape
            parent, _, leaf = name.rpartition(".")
            with torch.device(module.weight.device):
                shard = ExpertShard(
                    experts,
                    in_features,
                    out_features,
                    bias=module.bias is not None,
                    index=index,
                    size=size,
                )
            setattr(model.get_submodule(parent) if parent else model, leaf, shard)


def is_expert_shard(module: nn.Module) -> bool:
    """Whether `module`'s parameters are expert-parallel shards (reduced over edp, their norm over ep)."""
    return isinstance(module, ExpertShard)


def expert_params(
    model: nn.Module, facts: ParamTable
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(dense, expert) named parameters — the experts' (their facts say `expert_sharded`) are reduced over
    edp, the rest over dp."""
    dense: list[tuple[str, nn.Parameter]] = []
    experts: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():
        (experts if facts[p].expert_sharded else dense).append((name, p))
    return dense, experts


class ExpertParallel:
    """One rank's token dispatcher over its ep group (module docstring)."""

    def __init__(self, comm: Communicator, experts: int) -> None:
        self.comm = comm
        self.size, self.index = comm.size("ep"), comm.index("ep")
        self.experts, self.local = experts, experts // self.size
        #: rows this rank sent to and received from each ep rank in the last forward, per layer
        self.splits: dict[str, dict[str, list[int]]] = {}

    def run(
        self,
        layer: str,
        rows: torch.Tensor,
        counts: torch.Tensor,
        experts: nn.Module,
        capacity: int | None = None,
    ) -> torch.Tensor:
        """Rows in expert-major order with `counts` per (global) expert → the experts' outputs, same order;
        `capacity` (C, the same on every rank: a function of the config) for the equal-split dispatch."""
        if capacity is not None:
            return self._capacity(layer, rows, counts, experts, capacity)
        per_rank = counts.view(self.size, self.local)
        recv_counts = torch.empty_like(per_rank)
        self.comm.all_to_all(recv_counts, per_rank.contiguous(), "ep", label=f"moe {layer} counts")
        send, recv = per_rank.sum(1).tolist(), recv_counts.sum(1).tolist()
        self.splits[layer] = {"send": send, "recv": recv}
        got = _AllToAll.apply(
            rows, self.comm, _Splits(send=send, recv=recv, label=f"moe {layer} dispatch")
        )
        # (source rank, local expert) blocks → local-expert-major for the grouped experts, and back
        src_major = recv_counts.reshape(-1).tolist()
        blocks = list(got.split(src_major))
        order = [s * self.local + e for e in range(self.local) for s in range(self.size)]
        out = experts(torch.cat([blocks[i] for i in order]), recv_counts.sum(0).tolist())
        done = dict(zip(order, out.split([src_major[i] for i in order]), strict=True))
        back = torch.cat([done[i] for i in range(len(src_major))])
        return _AllToAll.apply(
            back, self.comm, _Splits(send=recv, recv=send, label=f"moe {layer} combine")
        )

    def _capacity(
        self, layer: str, rows: torch.Tensor, counts: torch.Tensor, experts: nn.Module, cap: int
    ) -> torch.Tensor:
        """Every expert padded to C rows from this rank: equal splits, no count exchange (DeepSpeed's)."""
        padded = rows.new_zeros((self.experts * cap, rows.shape[1]))
        slot = torch.cat(
            [
                torch.arange(int(c), device=rows.device) + e * cap
                for e, c in enumerate(counts.tolist())
            ]
        )
        padded = padded.index_copy(0, slot, rows)
        split = [self.local * cap] * self.size
        self.splits[layer] = {"send": split, "recv": split}
        got = _AllToAll.apply(
            padded, self.comm, _Splits(send=split, recv=split, label=f"moe {layer} dispatch")
        )
        blocks = got.view(self.size, self.local, cap, -1).transpose(0, 1).reshape(-1, rows.shape[1])
        out = experts(blocks, [self.size * cap] * self.local)
        back = out.view(self.local, self.size, cap, -1).transpose(0, 1).reshape(-1, rows.shape[1])
        returned = _AllToAll.apply(
            back.contiguous(),
            self.comm,
            _Splits(send=split, recv=split, label=f"moe {layer} combine"),
        )
        return returned.index_select(0, slot)
