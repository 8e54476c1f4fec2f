"""What a checkpoint is on disk, and how to tell a complete one from a broken one. No torch: the launcher
checks a `--resume` path before any process starts.

    RUN/checkpoints/step_000012/         complete: the training state before step 12
        .metadata                        DCP's index (every key, its shape and dtype, the file holding it)
        __0_0.distcp, __1_0.distcp, …    each rank's shards (torch.distributed.checkpoint)
        workbench.json                   written last, by rank 0: step, model, layout, files and their sizes
    RUN/checkpoints/step_000012.partial/ being written, or abandoned by a crash: never read

A directory counts as a checkpoint only once `workbench.json` is in it and it has been renamed from
`.partial` (an atomic rename); nothing is ever overwritten in place. `verify` re-checks it on load: the
marker, DCP's metadata, every file at its recorded size and — with `checksums` (the launcher, before any
process starts; `workbench checkpoint verify`) — its CRC32, which each rank computed over the files it wrote
(read back right after DCP wrote them) and rank 0 recorded in the marker: a flipped bit anywhere is refused,
naming the file. A checkpoint written before checksums were recorded still loads, with a note.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import zlib
from typing import Any

from workbench.config import RunConfig

MARKER = "workbench.json"
#: the layout a checkpoint was saved under (recorded; another layout loads it: engine/checkpoint/layout.py)
LAYOUT_KEYS = (
    "dp",
    "cp",
    "tp",
    "pp",
    "zero",
    "virtual_stages",
    "schedule",
    "precision",
    "grad_reduce_dtype",
)
#: what must be equal between the run that saved and the run that loads: the tensors' dtypes and roles
SAME = ("precision",)


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded; the message names the file and the reason."""


def run_shape(cfg: RunConfig) -> dict[str, Any]:
    """What a checkpoint is compared with: the config as config.json resolves it (model dims, world size)."""
    return {
        **cfg.to_dict(),
        "model": dataclasses.asdict(cfg.model_config),
        "world_size": cfg.world_size,
    }


def checkpoint_root(cfg: RunConfig, run_dir: str) -> str:
    return cfg.checkpoint_dir or os.path.join(run_dir, "checkpoints")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step:06d}")


def file_crc32(path: str, chunk: int = 1 << 22) -> str:
    """The file's CRC32 (zlib's, as hex), read in 4 MiB chunks."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def write_marker(
    path: str,
    step: int,
    config: dict[str, Any],
    tensor_bytes: int,
    checksums: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Rank 0, after every rank's shards and DCP's metadata are written: the marker, last. `bytes` is
    what the files hold, `tensor_bytes` the tensors in them (the rest: DCP's index and its framing of
    each tensor, about 1.5 kB apiece), `checksums` each file's CRC32."""
    files = {
        f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path)) if f != MARKER
    }
    marker = {
        "step": step,
        "model": config["model"],
        "layout": {k: config.get(k) for k in LAYOUT_KEYS},
        "world_size": config.get("world_size"),
        "files": files,
        "bytes": sum(files.values()),
        "tensor_bytes": tensor_bytes,
    }
    if checksums is not None:
        marker["checksums"] = {"crc32": dict(sorted(checksums.items()))}
    tmp = os.path.join(path, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(marker, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MARKER))
    return marker


def verify(
    path: str, config: dict[str, Any] | None = None, checksums: bool = False
) -> dict[str, Any]:
    """The checkpoint's marker, or CheckpointError naming the file and what is wrong with it. `checksums`:
    also read every file and compare its CRC32 with the marker's (the ranks check sizes only: the launcher
    has read the files once before any of them started)."""
    marker_path = os.path.join(path, MARKER)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not os.path.exists(marker_path):
        raise CheckpointError(f"{marker_path} is missing: the checkpoint was never completed")
    with open(marker_path) as f:
        marker = json.load(f)
    if ".metadata" not in marker["files"] or not os.path.exists(os.path.join(path, ".metadata")):
        raise CheckpointError(
            f"{os.path.join(path, '.metadata')} is missing: DCP cannot index the shards"
        )
    for name, size in marker["files"].items():
        file = os.path.join(path, name)
        if not os.path.exists(file):
            raise CheckpointError(f"{file} is missing (the marker lists it with {size} bytes)")
        if os.path.getsize(file) != size:
            raise CheckpointError(
                f"{file} has {os.path.getsize(file)} bytes, the marker recorded {size}: "
                f"truncated or changed after the checkpoint was written"
            )
    if checksums:
        _same_checksums(path, marker)
    if config is not None:
        _same_run_shape(path, marker, config)
    return marker


def _same_checksums(path: str, marker: dict[str, Any]) -> None:
    recorded = marker.get("checksums", {}).get("crc32")
    if recorded is None:
        return  # written before checksums were recorded: sizes only (has_checksums says so)
    for name, crc in recorded.items():
        now = file_crc32(os.path.join(path, name))
        if now != crc:
            raise CheckpointError(
                f"{os.path.join(path, name)}: CRC32 {now}, the marker recorded {crc} — its bytes "
                f"changed after the checkpoint was written (a flipped bit, a bad disk, an edit); "
                f"resume from another checkpoint"
            )


def has_checksums(marker: dict[str, Any]) -> bool:
    return "crc32" in marker.get("checksums", {})


def _same_run_shape(path: str, marker: dict[str, Any], config: dict[str, Any]) -> None:
    # config.json adds the preset's name
    dims = {k: config["model"].get(k) for k in marker["model"]}
    if marker["model"] != dims:
        diff = {k: (v, dims[k]) for k, v in marker["model"].items() if dims[k] != v}
        raise CheckpointError(f"{path} holds a different model: (saved, this run) {diff}")
    for k in SAME:
        if marker["layout"].get(k) != config.get(k):
            raise CheckpointError(
                f"{path} was saved with {k}={marker['layout'].get(k)!r}, this run has "
                f"{k}={config.get(k)!r}: the saved tensors do not fit"
            )


def complete_steps(root: str) -> list[str]:
    """The complete checkpoint directories under `root`, oldest first (partial ones are not listed)."""
    if not os.path.isdir(root):
        return []
    names = sorted(
        n for n in os.listdir(root) if n.startswith("step_") and not n.endswith(".partial")
    )
    return [os.path.join(root, n) for n in names if os.path.exists(os.path.join(root, n, MARKER))]


def latest_good(
    root: str, config: dict[str, Any] | None = None, checksums: bool = False
) -> tuple[str | None, list[str]]:
    """The newest checkpoint under `root` that verifies, and why each newer one was passed over."""
    skipped: list[str] = []
    for path in reversed(complete_steps(root)):
        try:
            verify(path, config, checksums)
            return path, skipped
        except CheckpointError as e:
            skipped.append(str(e))
    return None, skipped


def resolve_resume(
    resume: str, root: str, config: dict[str, Any] | None = None, checksums: bool = False
) -> tuple[str | None, list[str]]:
    """`auto`: the newest good checkpoint under the run's checkpoint directory (None: start afresh).
    A path: that checkpoint, or the newest good one under it when it is a directory of checkpoints."""
    if resume == "auto":
        return latest_good(root, config, checksums)
    if os.path.exists(os.path.join(resume, MARKER)) or not complete_steps(resume):
        verify(resume, config, checksums)
        return resume, []
    path, skipped = latest_good(resume, config, checksums)
    if path is None:
        raise CheckpointError(f"{resume}: no complete checkpoint loads: {skipped}")
    return path, skipped


def prune(root: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` complete checkpoints (0 keeps all); returns what was deleted."""
    if keep <= 0:
        return []
    old = complete_steps(root)[:-keep]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def verify_all(path: str) -> list[tuple[str, str | None]]:
    """`workbench checkpoint verify PATH`: every checkpoint at PATH (one, a directory of them, or a run's
    directory) checked with its checksums — (checkpoint, None when good else why); an unfinished one is bad."""
    root = (
        os.path.join(path, "checkpoints")
        if os.path.isdir(os.path.join(path, "checkpoints"))
        else path
    )
    if os.path.exists(os.path.join(path, MARKER)) or os.path.basename(path.rstrip("/")).startswith(
        "step_"
    ):
        found = [path]
    else:
        found = (
            sorted(os.path.join(root, n) for n in os.listdir(root) if n.startswith("step_"))
            if os.path.isdir(root)
            else []
        )
    out: list[tuple[str, str | None]] = []
    for ckpt in found:
        try:
            marker = verify(ckpt, checksums=True)
            out.append(
                (
                    ckpt,
                    None if has_checksums(marker) else "good by sizes (written without checksums)",
                )
            )
        except CheckpointError as e:
            out.append((ckpt, f"BAD: {e}"))
    return out


# ---- the launcher's side -------------------------------------------------------------------------
def check_resume(cfg: RunConfig, run_dir: str) -> tuple[str | None, int]:
    """Before any process starts: the checkpoint a resume will load and its step (None, 0: a fresh
    start under 'auto'); a path that does not load raises ConfigError naming the file and why."""
    from workbench.config import ConfigError

    if not cfg.resume:
        return None, 0
    try:
        path, _ = resolve_resume(
            cfg.resume, checkpoint_root(cfg, run_dir), run_shape(cfg), checksums=True
        )
    except CheckpointError as e:
        raise ConfigError(f"resume={cfg.resume!r}: {e}") from e
    if path is None:
        return None, 0
    with open(os.path.join(path, MARKER)) as f:
        marker = json.load(f)
    step = marker["step"]
    if not has_checksums(marker):
        print(
            f"[workbench] note: {path} was written before checkpoints recorded checksums: its files' sizes "
            f"are checked, not their bytes",
            file=sys.stderr,
            flush=True,
        )
    if step >= cfg.steps:
        raise ConfigError(
            f"resume={cfg.resume!r}: {path} is at step {step}, and steps={cfg.steps}: nothing left "
            f"to train; raise steps above {step}"
        )
    return path, step


def archive_attempt(run_dir: str, step: int) -> str:
    """Resuming in the run's own directory: the earlier attempt's files move to attempts/<n>/ (checkpoints
    stay), and the new metrics.jsonl starts with that attempt's rows before `step`."""
    attempts = os.path.join(run_dir, "attempts")
    dest = os.path.join(attempts, str(len(os.listdir(attempts)) if os.path.isdir(attempts) else 0))
    os.makedirs(dest)
    for name in os.listdir(run_dir):
        if name not in ("checkpoints", "attempts"):
            shutil.move(os.path.join(run_dir, name), os.path.join(dest, name))
    old = os.path.join(dest, "metrics.jsonl")
    if os.path.exists(old):
        copy_metrics_before(old, os.path.join(run_dir, "metrics.jsonl"), step)
    return dest


def copy_metrics_before(src: str, dst: str, step: int) -> None:
    """metrics.jsonl's rows of the steps before `step`, from `src` into `dst` (a resume redoes the rest)."""
    with open(src) as f:
        rows = [line for line in f if line.strip() and json.loads(line)["step"] < step]
    with open(dst, "w") as out:
        out.writelines(rows)
