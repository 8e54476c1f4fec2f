"""Writing when the disk may fill: one message that names the file and what was not written, instead of a
traceback from inside `json.dump`.

    with writing(path, "the metrics of step 12"):
        ...                       # an OSError ENOSPC in here becomes DiskFull(path, what, free space)

A rank's error file must survive a full disk: `reserve_error_file` writes a placeholder of 64 KiB at the
start of the run (real blocks, not a sparse file), and `write_error_file` writes the error into it in place —
no new block is needed — then renames it. No torch.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

RESERVED = 64 * 1024


class DiskFull(OSError):
    """No space left where a run writes: the message names the file, what was not written and the free space."""


def _free(path: str) -> str:
    try:
        usage = shutil.disk_usage(_existing(path))
    except OSError:
        return "free space unknown"
    return f"{usage.free:,} bytes free of {usage.total:,}"


#: free bytes under which a failed write is put down to a full disk: torch.save's zip writer reports a short
#: write as "unexpected pos …" without the ENOSPC behind it (seen here on a full tmpfs, inside DCP's save)
NEARLY_FULL = 1 << 20


def full(e: BaseException, path: str | None = None) -> bool:
    """Whether `e` (or what caused it: DCP wraps its writers' errors) is a full disk — ENOSPC, or any failure
    while `path`'s filesystem has next to nothing free."""
    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if (
            isinstance(err, OSError)
            and err.errno == errno.ENOSPC
            or "No space left on device" in str(err)
        ):
            return True
        err = err.__cause__ or err.__context__
    if path is None:
        return False
    try:
        return shutil.disk_usage(_existing(path)).free < NEARLY_FULL
    except OSError:
        return False


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def disk_full(path: str, what: str) -> DiskFull:
    return DiskFull(
        errno.ENOSPC,
        f"no space left on the device holding {path}: {what} was not written "
        f"({_free(path)}); free space there, or choose another out=",
    )


@contextmanager
def writing(path: str, what: str) -> Iterator[None]:
    """Turn a full disk inside the block into DiskFull naming `path` and `what`."""
    try:
        yield
    except DiskFull:
        raise
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        if full(e, path):
            raise disk_full(path, what) from e
        raise


def reserve_error_file(run_dir: str, rank: int) -> str:
    """The placeholder a rank's error file will be written into (real zero bytes, so that writing it later
    allocates nothing); removed when the rank ends well."""
    path = os.path.join(run_dir, f".error_rank{rank}.reserved")
    with open(path, "wb") as f:
        f.write(b"\0" * RESERVED)
    return path


def write_error_file(path: str, reserved: str | None, record: dict[str, Any]) -> None:
    """`record` as JSON at `path`: into the reserved placeholder (cut to fit: the traceback and the flight
    recorder shortened first), then renamed; a plain write where there is no placeholder."""
    data = json.dumps(record, indent=2).encode()
    for cut in (
        {"last_collectives": (record.get("last_collectives") or [])[-8:]},
        {"traceback": str(record.get("traceback", ""))[-4000:]},
        {
            "last_collectives": [],
            "traceback": str(record.get("traceback", ""))[-1000:],
            "message": str(record.get("message", ""))[:4000],
        },
    ):
        if len(data) <= RESERVED:
            break
        record = {**record, **cut}
        data = json.dumps(record, indent=2).encode()
    if reserved and os.path.exists(reserved):
        with open(reserved, "r+b") as f:
            f.write(data)
            f.truncate(len(data))
        os.replace(reserved, path)
        return
    with open(path, "wb") as f:
        f.write(data)
