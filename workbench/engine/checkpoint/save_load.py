"""Checkpoint and resume with torch.distributed.checkpoint (DCP): every rank writes its own pieces of the
training state, in parallel; the layout on disk and what makes one complete are `workbench/engine/checkpoint/files.py`.

What a checkpoint holds — everything the next step depends on, so a resumed run's losses are
bit-identical to the uninterrupted run's:

    model/<name>|<start>+<n>      the parameters, as pieces of the whole model's tensors (flattened)
    exp_avg/…, exp_avg_sq/…       Adam's moments, pieced the same way (ZeRO: the rank's slices)
    master/…                      16-bit runs: the fp32 master weights
    optim/step, optim/loss_scaler Adam's step (equal for every tensor), the fp16 loss scaler
    rng/rank<r>                   each rank's CPU generator
    (the step is in the marker; the data of step k is a function of (seed, k), the LR of k likewise)

Pieces (engine/checkpoint/layout.py) name the *global* tensor and the range they cover, so a checkpoint
saved under one layout loads under another: each rank asks DCP for the saved pieces that overlap its
own and copies the overlaps in place (resharding). Each piece is written by one rank — the first replica
— so the bytes on disk are the sharded states, once.

Save: every rank writes into `step_N.partial` (`dcp.save`, a collective over the world), then rank 0
writes the marker and renames the directory to `step_N`, and prunes to the newest `keep_checkpoints`.
Both saving and loading are spans (category `checkpoint`) with the bytes this rank wrote or read.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from workbench.config import RunConfig
from workbench.engine.checkpoint.files import (
    CheckpointError,
    checkpoint_root,
    file_crc32,
    prune,
    resolve_resume,
    run_shape,
    step_dir,
    verify,
    write_marker,
)
from workbench.engine.checkpoint.layout import pieces
from workbench.engine.parallelize import Strategy
from workbench.trace.disk import writing

if TYPE_CHECKING:
    from torch.distributed.checkpoint import Metadata


def _dcp():
    """torch.distributed.checkpoint, imported when a checkpoint is saved or loaded (it costs every rank
    ~0.7 s at start-up otherwise)."""
    import torch.distributed.checkpoint as dcp

    return dcp


def resume_step(strategy: Strategy, *, config: RunConfig, run_dir: str) -> int:
    """The step to start from: 0, or the checkpoint's that `config.resume` names (under the run's
    checkpoint directory: `config.checkpoint_dir`, or `run_dir`'s)."""
    if not config.resume:
        return 0
    shape = run_shape(config)
    path, skipped = resolve_resume(config.resume, checkpoint_root(config, run_dir), shape)
    if skipped:
        strategy.recorder.info["checkpoints_skipped"] = skipped
        if strategy.groups.rank == 0:
            print(f"[workbench] passed over broken checkpoints: {skipped}", flush=True)
    if path is None:
        return 0
    strategy.recorder.info["resumed_from"] = path
    return load(strategy, path, shape=shape)


def maybe_save(strategy: Strategy, step: int, *, config: RunConfig, run_dir: str) -> None:
    """After step `step`: a checkpoint of the state before step + 1, every `config.checkpoint_every`
    steps, keeping the newest `config.keep_checkpoints`."""
    if config.checkpoint_every and (step + 1) % config.checkpoint_every == 0:
        save(
            strategy,
            step + 1,
            root=checkpoint_root(config, run_dir),
            shape=run_shape(config),
            keep=config.keep_checkpoints,
        )


def _scalars(strategy: Strategy, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adam's step (every tensor's is the same), the loss scaler, this rank's RNG."""
    out = {"optim/step": next(v for k, v in state.items() if k.endswith(".step"))}
    if "loss_scaler" in state:
        out["optim/loss_scaler"] = state["loss_scaler"]
    out[f"rng/rank{strategy.groups.rank}"] = torch.get_rng_state()
    return out


def training_state(strategy: Strategy) -> dict[str, torch.Tensor]:
    """What this rank writes: the pieces it owns and the scalars (rank 0's; the RNG of every rank)."""
    state = strategy.updater.checkpoint_state()
    owned = {p.key: p.view for p in pieces(strategy, state) if p.owned}
    scalars = _scalars(strategy, state)
    return owned | {
        k: v for k, v in scalars.items() if strategy.groups.rank == 0 or k.startswith("rng/")
    }


def tensor_bytes(metadata: Metadata) -> int:
    """The bytes of every tensor chunk DCP's index lists (each written once)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return sum(
        math.prod(c.sizes) * m.properties.dtype.itemsize
        for m in metadata.state_dict_metadata.values()
        if isinstance(m, TensorStorageMetadata)
        for c in m.chunks
    )


def _own_files(path: str, rank: int) -> list[str]:
    return sorted(
        f for f in os.listdir(path) if f.startswith(f"__{rank}_") and f.endswith(".distcp")
    )


def save(strategy: Strategy, step: int, *, root: str, shape: dict[str, Any], keep: int) -> str:
    """Write the state before step `step` to `root/step_N` (atomically: a marker, then a rename), its
    marker recording the run's `shape` (files.run_shape); keep the newest `keep` checkpoints."""
    rank, world_size = strategy.groups.rank, strategy.groups.size("world")
    final = step_dir(root, step)
    partial = final + ".partial"
    if rank == 0:
        if os.path.exists(final):
            raise CheckpointError(f"{final} exists: a checkpoint is never overwritten")
        shutil.rmtree(partial, ignore_errors=True)  # an abandoned attempt
        os.makedirs(partial)
    strategy.comm.barrier()
    with strategy.recorder.span(
        f"checkpoint save step {step}", "checkpoint", "compute", step=step
    ) as args:
        with writing(partial, f"checkpoint step {step} (left .partial: never resumed from)"):
            metadata = _dcp().save(training_state(strategy), checkpoint_id=partial)
        # this rank's files, written when its save returns: their sizes, and their CRC32s read back while the
        # page cache still holds them — before the barrier after which rank 0 renames the directory
        mine = _own_files(partial, rank)
        args["bytes"] = sum(os.path.getsize(os.path.join(partial, f)) for f in mine)
        sums: list[Any] = [None] * world_size
        dist.all_gather_object(sums, {f: file_crc32(os.path.join(partial, f)) for f in mine})
        if rank == 0:
            checksums = {f: c for part in sums for f, c in part.items()}
            checksums[".metadata"] = file_crc32(os.path.join(partial, ".metadata"))
            args["total_bytes"] = write_marker(
                partial, step, shape, tensor_bytes(metadata), checksums
            )["bytes"]
            os.rename(partial, final)
            args["pruned"] = [os.path.basename(p) for p in prune(root, keep)]
        strategy.comm.barrier()
    return final


def load(strategy: Strategy, path: str, *, shape: dict[str, Any]) -> int:
    """Fill this rank's training state from the checkpoint at `path`, whatever layout saved it (its
    marker checked against the run's `shape`: files.run_shape); return the step to run next. Called at
    start-up, before the first step: its memory is counted as a measured step's (trace/step_clock.py)."""
    memory = strategy.memory
    marker = verify(path, shape)
    meta = _dcp().FileSystemReader(path).read_metadata()
    saved = saved_pieces(meta)
    state = strategy.updater.checkpoint_state()
    mine = pieces(strategy, state)
    wanted: dict[str, torch.Tensor] = {}
    for p in mine:
        for start, n, key, dtype in saved.get(p.name, []):
            if start < p.start + p.view.numel() and p.start < start + n and key not in wanted:
                wanted[key] = torch.empty(n, dtype=dtype, device=p.view.device)
    scalars = {k: v for k, v in _scalars(strategy, state).items() if k in meta.state_dict_metadata}
    with strategy.recorder.span(
        f"checkpoint load step {marker['step']}",
        "checkpoint",
        "compute",
        step=marker["step"],
        path=path,
    ) as args:
        staged = sum(t.numel() * t.element_size() for t in wanted.values())
        # the saved pieces, read before their overlaps are copied in
        memory.add("temporary", staged)
        _dcp().load(wanted | scalars, checkpoint_id=path)
        memory.snapshot()
        missing = _copy_overlaps(mine, saved, wanted)
        wanted.clear()
        memory.add("temporary", -staged)
        if missing:
            raise CheckpointError(f"{path} does not cover this rank's state: {missing[:3]} …")
        _restore_scalars(strategy, state, scalars)
        strategy.updater.after_load()  # ZeRO-Offload: the host's masters follow the loaded slices
        args["bytes"] = staged
    strategy.count_model_states(measured=True)  # Adam's state exists now
    memory.snapshot()
    return int(marker["step"])


def saved_pieces(meta: Metadata) -> dict[str, list[tuple[int, int, str, torch.dtype]]]:
    """The pieces a checkpoint holds, by global tensor name: (start, numel, DCP key, dtype) each (a piece's
    key is `name|start+numel`, a tensor's; the scalars' keys have no `|`)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    saved: dict[str, list[tuple[int, int, str, torch.dtype]]] = {}
    for key, m in meta.state_dict_metadata.items():
        if "|" in key and isinstance(m, TensorStorageMetadata):
            name, _, rng = key.partition("|")
            start, n = (int(x) for x in rng.split("+"))
            saved.setdefault(name, []).append((start, n, key, m.properties.dtype))
    return saved


def _copy_overlaps(mine: list, saved: dict, loaded: dict[str, torch.Tensor]) -> list[str]:
    """Copy each loaded piece's overlap into the rank's own pieces; return those left incomplete."""
    missing = []
    for p in mine:
        covered = 0
        lo, hi = p.start, p.start + p.view.numel()
        for start, n, key, _ in saved.get(p.name, []):
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                p.view[a - lo : b - lo].copy_(loaded[key][a - start : b - start])
                covered += b - a
        if covered != hi - lo:
            missing.append(p.key)
    return missing


def _restore_scalars(
    strategy: Strategy, state: dict[str, torch.Tensor], scalars: dict[str, torch.Tensor]
) -> None:
    for k, v in state.items():
        if k.endswith(".step"):
            v.copy_(scalars["optim/step"])
    if "optim/loss_scaler" in scalars:
        strategy.updater.restore({"loss_scaler": scalars["optim/loss_scaler"]})
    rng = f"rng/rank{strategy.groups.rank}"
    if rng in scalars:  # a rank the saving run did not have keeps its generator
        torch.set_rng_state(scalars[rng])


def describe(path: str) -> str:
    """What a checkpoint holds (`workbench checkpoint inspect`): its step and layout, then each tensor —
    its key (whose @pp.tp[.dp] suffix says which shard), shape, dtype, bytes and the file holding it."""
    marker = verify(path)
    meta = _dcp().FileSystemReader(path).read_metadata()
    files = {idx.fqn: info.relative_path for idx, info in meta.storage_data.items()}
    lay = marker["layout"]
    lines = [
        f"{path}: the state before step {marker['step']}; dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
        f"zero={lay['zero']} {lay['precision']}; world size {marker['world_size']}; "
        f"{marker['bytes']:,} bytes in {len(marker['files'])} files "
        f"({marker.get('tensor_bytes', 0):,} of tensors)",
        f"{'key':<48} {'shape':<14} {'dtype':<9} {'bytes':>9}  file",
    ]
    for key, m in sorted(meta.state_dict_metadata.items()):
        if hasattr(m, "chunks"):
            n = math.prod(m.size) * m.properties.dtype.itemsize
            dtype = str(m.properties.dtype).replace("torch.", "")
            lines.append(
                f"{key:<48} {str(list(m.size)):<14} {dtype:<9} {n:>9,}  {files.get(key, '?')}"
            )
    return "\n".join(lines)
