"""Where each element of the *global* training state lives on this rank — the map that lets a checkpoint
saved under one layout load under another (dp2 ZeRO-3 → dp4 ZeRO-1, tp2 → dp2, pp2 → one stage).

Every tensor of the state is named as in the whole, single-process model — `model/blocks.0.attn.qkv.weight`,
`exp_avg/blocks.0.attn.qkv.weight`, `master/…` — and seen flattened: a rank holds *pieces* of it, runs of
consecutive elements [start, start + n), each a 1-D view into the rank's live storage:

    whole or replicated parameter     one piece, the whole tensor
    tensor-parallel shard             the runs of the global indices its module's `shard_param` selects
                                      (rows for column-parallel layers — three runs for q, k, v —, one run
                                      per row for row-parallel ones), found by sharding an index tensor
    ZeRO slice of a flat bucket/unit  the overlap of [r·per, (r+1)·per) with each parameter's range

A piece is *owned* (written) by one rank only: the first data-parallel replica (and context-parallel rank 0:
cp ranks hold the same parameters), and for a parameter every tensor-parallel rank holds whole,
tensor-parallel rank 0 — so the bytes on disk are the sharded states, once; ZeRO's slices are each one
rank's of its dp (dp×cp) group. Context parallelism shards no state, so a checkpoint reshards across cp;
expert parallelism's expert shards are located like tensor-parallel ones (by `shard_param`), written by the
first of the ranks holding them (edp index 0), so it reshards across ep. DualPipe's second copy of a part
(`pipeline_copy`) is not written: the first copy, equal to it, is; loading fills both.
Loading asks for the saved pieces that overlap each of its own and copies the overlaps in place.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from workbench.engine.parallelize import Strategy
from workbench.model.gpt import ShardedModule
from workbench.parallel.grad_sync import ChainedGradSync
from workbench.parallel.zero import ZeroDataParallel
from workbench.parallel.zero3 import Zero3DataParallel
from workbench.pipeline.stages import global_name


@dataclass(kw_only=True)
class Piece:
    name: str  # global tensor, e.g. "exp_avg/blocks.0.mlp.fc.weight"
    start: int  # flat offset in the global tensor
    view: torch.Tensor  # 1-D view of this rank's storage holding [start, start + numel)
    owned: bool  # this rank writes it

    @property
    def key(self) -> str:
        return f"{self.name}|{self.start}+{self.view.numel()}"


def runs(index: torch.Tensor) -> Iterator[tuple[int, int, int]]:
    """(local offset, global start, length) of the maximal runs of consecutive global indices."""
    flat = index.reshape(-1)
    if flat.numel() == 0:
        return
    breaks = (torch.nonzero(flat[1:] != flat[:-1] + 1).reshape(-1) + 1).tolist()
    for lo, hi in zip([0, *breaks], [*breaks, flat.numel()], strict=True):
        yield lo, int(flat[lo]), hi - lo


def _module_runs(model: nn.Module) -> dict[str, list[tuple[int, int, int]]]:
    """For each parameter (by its name in `model`), where its local elements sit in the global tensor."""
    out = {}
    for mname, module in model.named_modules():
        for leaf, p in module.named_parameters(recurse=False):
            shape = (
                module.full_shapes[leaf] if isinstance(module, ShardedModule) else tuple(p.shape)
            )
            index = torch.arange(int(torch.tensor(shape).prod()) if shape else 1).view(shape)
            if isinstance(module, ShardedModule):
                index = module.shard_param(leaf, index)
            out[f"{mname}.{leaf}" if mname else leaf] = list(runs(index))
    return out


def _flat_pieces(
    prefix: str,
    names: Sequence[str],
    params: Sequence[nn.Parameter],
    *,
    per: int,
    r: int,
    local: torch.Tensor,
) -> Iterator[Piece]:
    """ZeRO: the rank's slice [r·per, (r+1)·per) of a flat buffer of `params`, end to end, held in `local`."""
    offset, lo, hi = 0, r * per, (r + 1) * per
    for name, p in zip(names, params, strict=True):
        a, b = max(offset, lo), min(offset + p.numel(), hi)
        if a < b:
            yield Piece(
                name=f"{prefix}/{global_name(name)}",
                start=a - offset,
                view=local.reshape(-1)[a - lo : b - lo],
                owned=True,
            )
        offset += p.numel()


def pieces(strategy: Strategy, state: dict[str, torch.Tensor]) -> list[Piece]:
    """Every piece of this rank's training state: parameters, and from the updater's `state`
    (`checkpoint_state()`) Adam's moments and the fp32 masters."""
    groups, sync = strategy.groups, strategy.grad_sync
    dp_rank, tp_rank, cp_rank = groups.index("dp"), groups.index("tp"), groups.index("cp")
    names = {p: n for n, p in strategy.model.named_parameters()}
    parts = sync.parts if isinstance(sync, ChainedGradSync) else [sync]
    zeros = [s for s in parts if isinstance(s, ZeroDataParallel | Zero3DataParallel)]
    zero = zeros[0] if zeros else None
    out: list[Piece] = []
    if isinstance(zero, Zero3DataParallel):
        for i, u in enumerate(zero.units):
            un, per = [names[p] for p in u.params], u.shard.numel()
            out += _flat_pieces("model", un, u.params, per=per, r=zero.r, local=u.shard.data)
            for kind in ("exp_avg", "exp_avg_sq"):
                out += _flat_pieces(
                    kind, un, u.params, per=per, r=zero.r, local=state[f"{i}.{kind}"]
                )
        return out
    located = _module_runs(strategy.model)
    params = list(strategy.model.parameters())
    for i, p in enumerate(params):
        name = names[p]
        # an expert-parallel shard's first holder is the first of the ranks holding the same experts (edp)
        facts = strategy.facts[p]
        first = (groups.index("edp") if facts.expert_sharded else dp_rank) == 0
        owned = (
            first
            and cp_rank == 0
            and (tp_rank == 0 or facts.tp_sharded)
            and not facts.pipeline_copy  # DualPipe: the first copy's rank writes the part
        )
        tensors = {"model": p.data}
        if zero is None:
            tensors |= {kind: state[f"{i}.{kind}"] for kind in ("exp_avg", "exp_avg_sq")}
            if f"master.{i}" in state:
                tensors["master"] = state[f"master.{i}"]
        for prefix, t in tensors.items():
            out += [
                Piece(
                    name=f"{prefix}/{global_name(name)}",
                    start=start,
                    view=t.reshape(-1)[lo : lo + n],
                    owned=owned,
                )
                for lo, start, n in located[name]
            ]
    b = 0  # the updater's slices in order: each ZeRO sync's buckets (expert parallelism: dense, then experts)
    for part in (z for z in zeros if isinstance(z, ZeroDataParallel)):
        for bucket in part.buckets:
            bn = [names[p] for p in bucket.params]
            for kind in ("exp_avg", "exp_avg_sq"):
                out += _flat_pieces(
                    kind,
                    bn,
                    bucket.params,
                    per=bucket.shard.numel(),
                    r=part.r,
                    local=state[f"{b}.{kind}"],
                )
            b += 1
    return out
