"""Automatic restart after a failed rank (the brief's fault tolerance), on torchrun's own machinery.

With `max_restarts` R, torchrun (`--max-restarts R`) stops every rank when one fails and starts the
whole group again, up to R times, telling each new process its attempt in TORCHELASTIC_RESTART_COUNT.
A restarted rank here

    1. moves what its failed attempt left (trace, partial trace, error file) to attempts/restart-<n>/ —
       nothing is lost, and the run directory reads as one run again;
    2. resumes from the newest checkpoint that verifies (`resume='auto'`; a broken newest one is passed
       over for the one before), or from the run's own `resume` if there is none yet;
    3. rank 0 keeps the metrics of the steps before the resumed one, and marks every row with its
       `attempt`, so the restart shows in metrics.jsonl; the trace's `workbench` block carries it too;
    4. at the end, rank 0 writes trace_all_attempts.json: every attempt on one timeline (each placed by
       its wall-clock start), with a `restart <n>` marker (trace/merge.merge_attempts).

A fault injected with `fault='kill'` (SIGKILL, the way an out-of-memory killer or a lost machine ends a
process: no handler runs) fires in the first attempt only, so the restarted group can finish.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any

from workbench.checkpoint_files import checkpoint_root, copy_metrics_before, latest_good, run_shape
from workbench.config import RunConfig
from workbench.trace.merge import load_traces, merge_attempts, recover_partials


def attempt() -> int:
    """0 for the first attempt, n after torchrun's n-th restart."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def archive_failed_attempt(run_dir: str, rank: int) -> None:
    """This rank's files from the attempt before this one, into attempts/restart-<n>/."""
    n = attempt()
    if n == 0:
        return
    dest = os.path.join(run_dir, "attempts", f"restart-{n - 1}")
    os.makedirs(dest, exist_ok=True)
    for name in (f"trace_rank{rank}.json", f"trace_rank{rank}.partial.jsonl", f"error_rank{rank}.json"):
        if os.path.exists(os.path.join(run_dir, name)):
            shutil.move(os.path.join(run_dir, name), os.path.join(dest, name))


def write_all_attempts(run_dir: str, current: list[dict[str, Any]]) -> str | None:
    """Rank 0 at the end of a restarted run: trace_all_attempts.json, every attempt on one timeline."""
    dirs = sorted(glob.glob(os.path.join(run_dir, "attempts", "restart-*")),
                  key=lambda d: int(d.rsplit("-", 1)[1]))
    if not dirs:
        return None
    for d in dirs:
        recover_partials(d)
    path = os.path.join(run_dir, "trace_all_attempts.json")
    with open(path, "w") as f:
        json.dump(merge_attempts([load_traces(d) for d in dirs] + [current]), f)
    return path


def restarted_config(cfg: RunConfig, run_dir: str) -> RunConfig:
    """A restarted attempt resumes from the newest good checkpoint, else as the run was asked to."""
    if attempt() == 0:
        return cfg
    path, _ = latest_good(checkpoint_root(cfg, run_dir), run_shape(cfg))
    return cfg.replace(resume="auto") if path is not None else cfg


def trim_metrics(run_dir: str, step: int) -> None:
    """Rank 0 of a restarted attempt: the failed attempt's rows from `step` on are redone; keep the
    earlier ones (the full file goes to attempts/restart-<n>/)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if attempt() == 0 or not os.path.exists(path):
        return
    dest = os.path.join(run_dir, "attempts", f"restart-{attempt() - 1}")
    os.makedirs(dest, exist_ok=True)
    kept = os.path.join(dest, "metrics.jsonl")
    shutil.copy(path, kept)
    copy_metrics_before(kept, path, step)
