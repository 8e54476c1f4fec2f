"""Read an offline W&B run back (RUN/wandb/offline-run-*/run-*.wandb), for tests: wandb writes its records
as protobufs in LevelDB's log format — a 7-byte header (':W&B', magic 0xBEE1, version 0), then 32 KiB blocks
of chunks, each with a 7-byte header (CRC32C, length, type: 1 full, 2 first, 3 middle, 4 last; a block's
tail shorter than a header is padding). wandb has no Python reader of its own any more (its core is Go)."""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Any

BLOCK = 32 * 1024


def records(path: str) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "a W&B transaction log"
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):  # padding to the next block
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _items(items: Any) -> dict[str, Any]:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def offline_run(run_dir: str) -> dict[str, Any]:
    """The offline run under run_dir: its config, history rows (by step) and summary, as written."""
    (path,) = glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))
    config, history, summary = {}, {}, {}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            config.update(_items(r.run.config.update))
        elif kind == "config":
            config.update(_items(r.config.update))
        elif kind == "history":
            row = _items(r.history.item)
            history.setdefault(row["_step"], {}).update(row)
        elif kind == "summary":
            summary.update(_items(r.summary.update))
    return {
        "config": config,
        "history": [history[k] for k in sorted(history)],
        "summary": summary,
        "dir": os.path.dirname(path),
    }
