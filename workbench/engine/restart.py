"""Automatic restart after a failed rank (the brief's fault tolerance), on torchrun's own machinery.

With `max_restarts` R, torchrun (`--max-restarts R`) stops every rank when one fails and starts the
whole group again, up to R times, telling each new process its attempt in TORCHELASTIC_RESTART_COUNT.
Once the new group is formed, its ranks agree on the attempt number n (`begin_attempt` returns it;
the worker passes it on — to the trace, the metrics and fault injection —, no global holds it) and

    1. what the failed attempt left (traces, partial traces, error files) moves to attempts/restart-<n-1>/ —
       nothing is lost, and the run directory reads as one run again;
    2. resumes from the newest checkpoint that verifies (`resume='auto'`; a broken newest one is passed
       over for the one before), or from the run's own `resume` if there is none yet;
    3. rank 0 keeps the metrics of the steps before the resumed one, and marks every row with its
       `attempt`, so the restart shows in metrics.jsonl; the trace's `workbench` block carries it too;
    4. at the end, rank 0 writes trace_all_attempts.json: every attempt on one timeline (each placed by
       its wall-clock start), with a `restart <n>` marker (trace/merge.merge_attempts).

A fault injected with `fault='kill'` (SIGKILL, the way an out-of-memory killer or a lost machine ends a
process: no handler runs) fires in the first attempt only, so the restarted group can finish.

Elastic membership (`elastic`, launched with nnodes MIN:MAX): torchrun re-forms the group when a machine's
agent leaves (after it misses its heartbeats; that counts as a restart) or joins (a new rendezvous round,
not counted). The new group's world size sets dp (`elastic_world`), the data of each step is the same
global batch split over the new dp (data/synthetic.py), and the group resumes from the newest good
checkpoint resharded to its layout (engine/checkpoint/layout.py). torchrun's restart count is not an
attempt number any more — an agent that joins late starts at 0 — so the attempt is agreed by the group.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any

import torch
import torch.distributed as dist

from workbench.config import RunConfig
from workbench.engine.checkpoint.files import (
    checkpoint_root,
    copy_metrics_before,
    latest_good,
    run_shape,
)
from workbench.trace.merge import load_traces, merge_attempts, recover_partials

#: what one attempt's ranks leave in the run directory
RANK_FILES = (
    "trace_rank*.json",
    "trace_rank*.partial.jsonl",
    "error_rank*.json",
    "memory_profile_rank*.json",
)


def restart_count() -> int:
    """torchrun's count of this agent's restarts (TORCHELASTIC_RESTART_COUNT)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def elastic_world(cfg: RunConfig) -> RunConfig:
    """An elastic run's config for the world torchrun formed: dp = WORLD_SIZE / (cp·tp·pp)."""
    world = int(os.environ.get("WORLD_SIZE", cfg.world_size))
    if not cfg.elastic or world == cfg.world_size:
        return cfg
    cell = cfg.cp * cfg.tp * cfg.pp
    if world % cell:
        raise RuntimeError(
            f"torchrun formed a world of {world} ranks, not a multiple of cp×tp×pp = {cell}"
        )
    return cfg.replace(dp=world // cell).validate()


def begin_attempt(run_dir: str, device: torch.device) -> int:
    """Every rank of a newly formed group, before it traces anything: agree on the attempt number (the
    attempts/restart-* directories any host has, plus one if any host holds an earlier attempt's rank
    files), move those files there (one rank per host), and return the number: 0 for the first
    attempt, n for the n-th group formed after it. The worker (launching/worker.py) passes it on."""

    def leftovers() -> list[str]:
        return [p for pattern in RANK_FILES for p in glob.glob(os.path.join(run_dir, pattern))]

    done = len(glob.glob(os.path.join(run_dir, "attempts", "restart-*")))
    agreed = torch.tensor([done, int(bool(leftovers()))], device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    done, left = int(agreed[0]), int(agreed[1])
    if left and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        dest = os.path.join(run_dir, "attempts", f"restart-{done}")
        os.makedirs(dest, exist_ok=True)
        for path in leftovers():
            try:
                shutil.move(path, os.path.join(dest, os.path.basename(path)))
            except FileNotFoundError:  # a shared file system: another host moved it first
                pass
    dist.barrier()
    return done + left


def write_all_attempts(run_dir: str, current: list[dict[str, Any]]) -> str | None:
    """Rank 0 at the end of a restarted run: trace_all_attempts.json, every attempt on one timeline."""
    dirs = sorted(
        glob.glob(os.path.join(run_dir, "attempts", "restart-*")),
        key=lambda d: int(d.rsplit("-", 1)[1]),
    )
    if not dirs:
        return None
    for d in dirs:
        recover_partials(d)
    path = os.path.join(run_dir, "trace_all_attempts.json")
    with open(path, "w") as f:
        json.dump(merge_attempts([load_traces(d) for d in dirs] + [current]), f)
    return path


def restarted_config(cfg: RunConfig, run_dir: str, *, restarts: int) -> RunConfig:
    """A restarted attempt (any group of an elastic run: a late joiner cannot tell) resumes from the newest
    good checkpoint, else as the run was asked to. `restarts`: torchrun's count (`restart_count`), all a
    process knows before its group has agreed on the attempt."""
    if restarts == 0 and not cfg.elastic:
        return cfg
    path, _ = latest_good(checkpoint_root(cfg, run_dir), run_shape(cfg))
    return cfg.replace(resume="auto") if path is not None else cfg


def trim_metrics(run_dir: str, step: int, *, attempt: int) -> None:
    """Rank 0 of a restarted attempt (`attempt` > 0): the failed attempt's rows from `step` on are redone;
    keep the earlier ones (the full file goes to attempts/restart-<attempt − 1>/)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if attempt == 0 or not os.path.exists(path):
        return
    dest = os.path.join(run_dir, "attempts", f"restart-{attempt - 1}")
    os.makedirs(dest, exist_ok=True)
    kept = os.path.join(dest, "metrics.jsonl")
    shutil.copy(path, kept)
    copy_metrics_before(kept, path, step)
