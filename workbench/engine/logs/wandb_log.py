"""Weights & Biases while it trains (`--wandb [PROJECT]`): rank 0 logs what `--tensorboard` logs (each step's
points: engine/logs/tensorboard.py's `step_scalars`) and the run's config, and at the end attaches summary.json:
its figures as the W&B run's summary, and one row per rank as a table.

Offline unless you have logged in: without an API key (`wandb login`, or WANDB_API_KEY) the run is written
under RUN/wandb/ and nothing leaves the machine; `wandb sync RUN/wandb/offline-run-*` uploads it later.
WANDB_MODE, when set, decides instead. W&B's own console capture is off (torchrun and our progress keep
the terminal). Only rank 0 logs (its view, like metrics.jsonl); the per-rank picture stays in the traces.
`workbench compare --wandb` logs its table as a run of its own (`log_table`).
"""

from __future__ import annotations

import json
import netrc
import os
from collections.abc import Iterable
from typing import Any, Literal

#: summary.json's per-rank figures that make the table's columns
RANK_COLUMNS = (
    "rank",
    "dp",
    "tp",
    "pp",
    "step_time_s",
    "compute_s",
    "comm_s",
    "exposed_comm_s",
    "idle_s",
    "peak_total_bytes",
)


def logged_in() -> bool:
    """An API key is at hand: WANDB_API_KEY, or `wandb login`'s entry in ~/.netrc."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def mode() -> Literal["online", "offline"] | None:
    """None when WANDB_MODE is set: W&B reads it itself (and refuses a value it does not know); else online
    with a login, offline without one."""
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if logged_in() else "offline"


def start(project: str, name: str, out_dir: str, **kwargs: Any) -> Any:
    """A W&B run written under out_dir/wandb, in `mode()` (None: WANDB_MODE's), W&B's console capture off."""
    import wandb

    return wandb.init(
        project=project,
        name=name,
        dir=out_dir,
        mode=mode(),
        settings=wandb.Settings(console="off", silent=True),
        **kwargs,
    )


def log_table(project: str, out_dir: str, name: str, table: Any) -> None:
    """`workbench compare --wandb`: the comparison's table (a DataFrame) as a W&B run of its own, in out_dir."""
    import wandb

    run = start(project, name, out_dir, job_type="compare")
    run.log({"compare": wandb.Table(dataframe=table)})
    run.finish()


class WandB:
    """One W&B run for one workbench run, opened on rank 0 before the first step."""

    def __init__(self, run_dir: str, project: str, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = start(
            project, os.path.basename(os.path.abspath(run_dir)), run_dir, config=config
        )

    def write(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self, summary_path: str | None = None) -> None:
        """summary.json attached (its top-level figures, and a table of its ranks), then the run finished."""
        if summary_path is not None and os.path.exists(summary_path):
            with open(summary_path) as f:
                summary = json.load(f)
            self.run.summary.update(
                {
                    f"workbench/{k}": v
                    for k, v in summary.items()
                    if isinstance(v, int | float | str) and not isinstance(v, bool)
                }
            )
            rows: list[Iterable[Any]] = [
                [r.get(c) for c in RANK_COLUMNS] for r in summary.get("ranks", [])
            ]
            self.run.log(
                {"workbench/ranks": self.wandb.Table(columns=list(RANK_COLUMNS), data=rows)}
            )
        self.run.finish()
