"""torch's own flight recorder, turned on for every run and read back by `workbench doctor`.

torch.distributed keeps, per rank, a ring buffer of its last collectives (`TORCH_FR_BUFFER_SIZE`, formerly
`TORCH_NCCL_TRACE_BUFFER_SIZE`): process group, per-group sequence number, the op (`nccl:all_reduce`,
`gloo:all_reduce`), sizes, dtypes and — on NCCL — its state (scheduled, started, completed) from the
device's events. On NCCL its watchdog writes the buffer to `<TORCH_FR_DUMP_TEMP_FILE><rank>` when a
collective times out (`TORCH_NCCL_DUMP_ON_TIMEOUT`); `torchfrtrace` reads such dumps. We set both before
the process group exists, pointing the dump into the run directory, and every failing rank writes its
buffer there too (`dump`), on gloo as on NCCL — so a hang leaves torch's record beside ours
(comm/flight_recorder.py), whichever backend ran.

On NCCL the watchdog's reaction to a timeout is set to abort the communicators without killing the
process (`TORCH_NCCL_ASYNC_ERROR_HANDLING=2`): the rank itself ends its wait at the same deadline
(comm/device_timing.py) and raises `CommError`, so its error file is written. A user's own settings of
these variables are kept.

Reading (`read_dumps`, `behind`) imports no torch: the dumps are pickled dicts of plain values, loaded
with an unpickler that accepts nothing else.
"""

from __future__ import annotations

import glob
import io
import os
import pickle
import re
from typing import Any

from workbench.comm.flight_recorder import lagging

PREFIX = "fr_trace_rank"
ENTRIES = 2000


def environment(run_dir: str, backend: str) -> dict[str, str]:
    """What to set before the process group is created."""
    prefix = os.path.join(run_dir, PREFIX)
    env = {
        "TORCH_FR_BUFFER_SIZE": str(ENTRIES),
        "TORCH_NCCL_TRACE_BUFFER_SIZE": str(ENTRIES),
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
    }
    if backend == "nccl":
        env |= {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
    return env


def enable(run_dir: str, backend: str) -> None:
    for key, value in environment(run_dir, backend).items():
        os.environ.setdefault(key, value)


def dump(run_dir: str, rank: int) -> str | None:
    """Write this rank's buffer as torch's watchdog would (unless it already has); the path, or None where
    this torch has no flight recorder."""
    path = os.path.join(run_dir, f"{PREFIX}{rank}")
    if os.path.exists(path):
        return path
    try:
        from torch._C import _distributed_c10d

        # a private function that torch's stubs do not declare, absent from older releases
        dump_trace = getattr(_distributed_c10d, "_dump_fr_trace", None)
        if dump_trace is None:
            return None
        data = dump_trace(True, False)
    except (ImportError, RuntimeError):
        return None
    with open(path, "wb") as f:
        f.write(data)
    return path


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"a flight-recorder dump holds plain values only, not {module}.{name}"
        )


def read_dumps(run_dir: str) -> dict[int, dict[str, Any]]:
    """Every rank's dump in the run directory, by rank (unreadable files are left out)."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, f"{PREFIX}*")):
        match = re.search(rf"{PREFIX}(\d+)$", path)
        if match is None:
            continue
        try:
            with open(path, "rb") as f:
                out[int(match.group(1))] = _PlainUnpickler(io.BytesIO(f.read())).load()
        except (OSError, pickle.UnpicklingError, EOFError, ValueError):
            continue
    return out


def newest_per_group(dumps: dict[int, dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per process group (its description, e.g. "dp [0, 1]"), each rank's newest collective entry."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    for rank, d in dumps.items():
        for e in d.get("entries", []):
            if e.get("is_p2p"):
                continue
            name = e.get("process_group", ("", ""))[1] or str(e.get("pg_id"))
            newest = groups.setdefault(name, {}).get(rank)
            if newest is None or e.get("collective_seq_id", 0) >= newest.get(
                "collective_seq_id", 0
            ):
                groups[name][rank] = e
    return groups


def behind(dumps: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group, the ranks whose newest collective is older than another member's: the ones the others
    wait for. A member with no entry at all (named in the group's description) is behind too."""
    report = []
    for name, newest in sorted(newest_per_group(dumps).items()):
        members = [int(x) for x in re.findall(r"\d+", name.partition(" ")[2])] or sorted(newest)
        top, behind_ = lagging(
            {r: e.get("collective_seq_id", 0) for r, e in newest.items()}, members, dumps
        )
        if behind_:
            report.append(
                {
                    "group": name,
                    "blocked_at": top,
                    "behind": behind_,
                    "newest": {r: newest.get(r) for r in members if r in dumps},
                }
            )
    return report


def describe(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "no collective on this group"
    return (
        f"seq {entry.get('collective_seq_id')} {entry.get('profiling_name')} "
        f"{entry.get('input_sizes')} ({entry.get('state')})"
    )
