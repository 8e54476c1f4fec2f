"""Checkpoint and resume with torch.distributed.checkpoint (DCP): every rank writes its own shards of the
training state, in parallel; the layout on disk and what makes one complete are `workbench/checkpoint_files.py`.

What a checkpoint holds — everything the next step depends on, so a resumed run's losses are
bit-identical to the uninterrupted run's:

    model/<name>@pp.tp        the rank's parameters (ZeRO-3: its flat slices, @pp.tp.dp)
    optim/<i>.<state>@…       Adam's step, exp_avg, exp_avg_sq of each tensor the updater steps (ZeRO:
                              the rank's slices, @…dp); mixed precision adds the fp32 masters and the
                              loss scaler (scale, good steps in a row)
    rng/rank<r>               the CPU generator
    (the step is in the marker; the data of step k is a function of (seed, k), the LR of k likewise)

Keys: a tensor that every data-parallel replica holds the same (`@pp<p>.tp<t>`) has one key on all of
them, and DCP writes it once — the bytes on disk are the sharded states, not a copy per rank. What
differs between dp ranks (ZeRO's partitions) carries the dp coordinate too.

Save: every rank writes into `step_N.partial` (`dcp.save`, a collective over the world), then rank 0
writes the marker and renames the directory to `step_N`, and prunes to the newest `keep_checkpoints`.
Load (`dcp.load`) reads into the live tensors, in place. Both are spans (category `checkpoint`) with the
bytes this rank wrote or read.
"""

from __future__ import annotations

import math
import os
import shutil

import torch
import torch.distributed.checkpoint as dcp

from workbench.checkpoint_files import (
    CheckpointError,
    checkpoint_root,
    prune,
    resolve_resume,
    run_shape,
    step_dir,
    verify,
    write_marker,
)
from workbench.engine.parallelize import Strategy


def resume_step(strategy: Strategy) -> int:
    """The step to start from: 0, or the resumed checkpoint's (`RunConfig.resume`)."""
    ctx, cfg = strategy.ctx, strategy.ctx.config
    if not cfg.resume:
        return 0
    path, skipped = resolve_resume(cfg.resume, checkpoint_root(cfg, ctx.run_dir), run_shape(cfg))
    if skipped:
        ctx.recorder.info["checkpoints_skipped"] = skipped
        if ctx.rank == 0:
            print(f"[workbench] passed over broken checkpoints: {skipped}", flush=True)
    if path is None:
        return 0
    ctx.recorder.info["resumed_from"] = path
    return load(strategy, path, run_shape(cfg))


def maybe_save(strategy: Strategy, step: int) -> None:
    """After step `step`: a checkpoint of the state before step + 1, every `checkpoint_every` steps."""
    cfg = strategy.ctx.config
    if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0:
        save(strategy, step + 1, checkpoint_root(cfg, strategy.ctx.run_dir), run_shape(cfg))


def training_state(strategy: Strategy) -> dict[str, torch.Tensor]:
    """The live tensors of this rank's training state, under keys equal across replicas."""
    ctx, cfg = strategy.ctx, strategy.ctx.config
    c = ctx.grid.coords(ctx.rank)
    replica = f"@pp{c['pp']}.tp{c['tp']}"
    shard = f"{replica}.dp{c['dp']}"
    state: dict[str, torch.Tensor] = {}
    if cfg.zero == 3:
        state.update({f"model/zero3.{i}{shard}": p.data for i, p in enumerate(strategy.state_params)})
    else:
        state.update({f"model/{name}{replica}": p.data for name, p in strategy.model.named_parameters()})
    tag = shard if cfg.zero else replica
    state.update({f"optim/{k}{tag}": t for k, t in strategy.updater.checkpoint_state().items()})
    state[f"rng/rank{ctx.rank}"] = torch.get_rng_state()
    return state


def tensor_bytes(metadata: dcp.Metadata) -> int:
    """The bytes of every tensor chunk DCP's index lists (each written once)."""
    return sum(math.prod(c.sizes) * m.properties.dtype.itemsize
               for m in metadata.state_dict_metadata.values() if hasattr(m, "chunks") for c in m.chunks)


def _file_bytes(path: str, rank: int) -> int:
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.startswith(f"__{rank}_") and f.endswith(".distcp"))


def save(strategy: Strategy, step: int, root: str, config: dict) -> str:
    """Write the state before step `step` to `root/step_N` (atomically: a marker, then a rename)."""
    ctx = strategy.ctx
    final = step_dir(root, step)
    partial = final + ".partial"
    if ctx.rank == 0:
        if os.path.exists(final):
            raise CheckpointError(f"{final} exists: a checkpoint is never overwritten")
        shutil.rmtree(partial, ignore_errors=True)  # an abandoned attempt
        os.makedirs(partial)
    ctx.comm.barrier()
    with ctx.recorder.span(f"checkpoint save step {step}", "checkpoint", "compute", step=step) as args:
        metadata = dcp.save(training_state(strategy), checkpoint_id=partial)
        ctx.comm.barrier()
        args["bytes"] = _file_bytes(partial, ctx.rank)
        if ctx.rank == 0:
            args["total_bytes"] = write_marker(partial, step, config, tensor_bytes(metadata))["bytes"]
            os.rename(partial, final)
            args["pruned"] = [os.path.basename(p) for p in prune(root, ctx.config.keep_checkpoints)]
        ctx.comm.barrier()
    return final


def load(strategy: Strategy, path: str, config: dict) -> int:
    """Fill this rank's training state from the checkpoint at `path`; return the step to run next."""
    ctx = strategy.ctx
    marker = verify(path, config)
    with ctx.recorder.span(f"checkpoint load step {marker['step']}", "checkpoint", "compute",
                           step=marker["step"], path=path) as args:
        state = training_state(strategy)
        dcp.load(state, checkpoint_id=path)
        strategy.updater.restore({k.partition("/")[2].partition("@")[0]: v for k, v in state.items()
                                  if k.startswith("optim/")})
        torch.set_rng_state(state[f"rng/rank{ctx.rank}"])
        args["bytes"] = sum(t.numel() * t.element_size() for t in state.values())
    strategy.count_model_states()  # Adam's state exists now
    ctx.memory.snapshot()
    return int(marker["step"])


def describe(path: str) -> str:
    """What a checkpoint holds (`workbench checkpoint inspect`): its step and layout, then each tensor —
    its key (whose @pp.tp[.dp] suffix says which shard), shape, dtype, bytes and the file holding it."""
    marker = verify(path)
    meta = dcp.FileSystemReader(path).read_metadata()
    files = {idx.fqn: info.relative_path for idx, info in meta.storage_data.items()}
    lay = marker["layout"]
    lines = [f"{path}: the state before step {marker['step']}; dp={lay['dp']} tp={lay['tp']} pp={lay['pp']} "
             f"zero={lay['zero']} {lay['precision']}; world size {marker['world_size']}; "
             f"{marker['bytes']:,} bytes in {len(marker['files'])} files "
             f"({marker.get('tensor_bytes', 0):,} of tensors)",
             f"{'key':<48} {'shape':<14} {'dtype':<9} {'bytes':>9}  file"]
    for key, m in sorted(meta.state_dict_metadata.items()):
        if hasattr(m, "chunks"):
            n = math.prod(m.size) * m.properties.dtype.itemsize
            dtype = str(m.properties.dtype).replace("torch.", "")
            lines.append(f"{key:<48} {str(list(m.size)):<14} {dtype:<9} {n:>9,}  {files.get(key, '?')}")
    return "\n".join(lines)
