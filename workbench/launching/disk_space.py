"""Before launch: will the run's files fit? An estimate of what a run writes — its checkpoints (model states,
written once across the ranks, as many as are kept plus the one being written), its traces (each rank's
stream, its trace and the merged one), metrics and the ranks' reserved error files — against the free space
where `out` is. A run that would not fit is refused before any process starts (launch(check_disk=False),
`--no-check-disk`, to go anyway). The estimate is deliberately generous: a trace's size per step was measured
at ~12 kB a rank for `tiny` (52 events), and pipelines, buckets and layers add events. No torch."""

from __future__ import annotations

import os
import shutil

from workbench.config import ConfigError, RunConfig

#: a trace's bytes a step, a rank and a microbatch (measured ~12 kB for tiny, dp 2), and the copies of it that
#: exist at once (its stream while it runs, its file, the merged trace.json)
TRACE_BYTES_PER_STEP, TRACE_COPIES = 16_000, 2.5
METRICS_BYTES_PER_STEP, RESERVED_ERROR_FILE = 600, 64 * 1024


def estimated_output(config: RunConfig) -> dict[str, float]:
    """Bytes the run will hold on disk at its fullest, by kind."""
    psi = config.model_config.param_count()
    per_param = (
        (4 if config.precision == "fp32" else 2) + 8 + (0 if config.precision == "fp32" else 4)
    )
    kept = config.steps // config.checkpoint_every if config.checkpoint_every else 0
    if config.keep_checkpoints:
        # the newest is written before the oldest is pruned
        kept = min(kept, config.keep_checkpoints + 1)
    events = config.microbatches * config.virtual_stages if config.trace else 0
    return {
        "checkpoints": kept * psi * per_param * 1.02,
        "traces": config.steps
        * config.world_size
        * max(events, 0)
        * TRACE_BYTES_PER_STEP
        * TRACE_COPIES,
        "metrics": config.steps * METRICS_BYTES_PER_STEP,
        "error files (reserved)": config.world_size * RESERVED_ERROR_FILE,
    }


def _used(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def check_disk_space(config: RunConfig, run_dir: str, replacing: bool) -> None:
    """ConfigError when the estimate exceeds the free space on run_dir's filesystem (counting what --force
    would remove), naming both and the parts of the estimate."""
    parent = os.path.dirname(os.path.abspath(run_dir))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    free = shutil.disk_usage(parent).free + (
        _used(run_dir) if replacing and os.path.isdir(run_dir) else 0
    )
    parts = estimated_output(config)
    if sum(parts.values()) <= free:
        return
    detail = ", ".join(f"{k} {v / 2**20:,.1f} MiB" for k, v in parts.items() if v)
    raise ConfigError(
        f"{run_dir}: the run would write about {sum(parts.values()) / 2**20:,.1f} MiB ({detail}) and "
        f"its filesystem has {free / 2**20:,.1f} MiB free; free space, keep fewer checkpoints "
        f"(keep_checkpoints), choose another out= — or launch anyway: check_disk=False "
        f"(--no-check-disk)"
    )
