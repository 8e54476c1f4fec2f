"""The subcommands that launch runs: run (its flags parsed by cli/run_command.py) and compare.

Exit codes: 0 done, 1 a run failed, 2 bad input (a configuration, an earlier run that --force would
replace), 130 interrupted (Ctrl-C, SIGTERM or SIGHUP: torchrun and its ranks are stopped, and what they
wrote stays).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from workbench.cli.run_command import parse_run
from workbench.cli.run_dir_commands import print_summary
from workbench.config import ConfigError, ModelConfig, RunConfig


def shown_config(config: RunConfig) -> dict[str, Any]:
    """The settings a run prints before it starts: those that differ from RunConfig's defaults (the whole
    resolved configuration is config.json, and `--print-config` prints it)."""
    defaults = RunConfig().to_dict()
    return {k: v for k, v in config.to_dict().items() if v != defaults.get(k)}


def absolute_csv(schedule: str) -> str:
    """csv:FILE with FILE made absolute: every rank (and every later reader of config.json) finds it."""
    return f"csv:{os.path.abspath(schedule[4:])}" if schedule.startswith("csv:") else schedule


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled like Ctrl-C (the launcher stops torchrun and its ranks)."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(f"signal {signum}")


def cmd_run(argv: list[str]) -> int:
    """`workbench run ARGS`: parse (cli/run_command.py), validate, print the settings or launch."""
    from workbench.config.files import config_text
    from workbench.launching.launcher import Nodes, RunFailed, default_run_dir, launch

    try:
        config, a = parse_run(argv)
        config = config.replace(schedule=absolute_csv(config.schedule)).validate()
    except ConfigError as e:
        print(f"workbench: invalid configuration: {e}", file=sys.stderr)
        return 2
    if a.print_config:
        print(config_text(config), end="")
        return 0
    changed = " ".join(
        f"{k}={json.dumps(v) if isinstance(v, dict | list) else v}"
        for k, v in shown_config(config).items()
    )
    print(
        f"settings (beside the defaults; all of them: --print-config, and config.json): {changed or 'none'}",
        flush=True,
    )
    if isinstance(config.model, ModelConfig):  # given as changes to a preset: the dims that result
        print(f"model: {config.model_config}", flush=True)
    nodes = Nodes(nnodes=a.nnodes, node_rank=a.node_rank, rdzv_endpoint=a.rdzv_endpoint)
    out = a.out or default_run_dir(config)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    try:
        run = launch(
            config,
            out,
            progress=not a.quiet,
            nodes=nodes,
            force=a.force,
            launcher=a.launcher,
            ray_address=a.ray_address,
            check_disk=a.check_disk,
            check_memory=a.check_memory,
            cluster=a.cluster,
        )
    except (ConfigError, FileExistsError) as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"workbench: run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        why = f"stopped by {e}" if isinstance(e, Stopped) else "interrupted"
        print(
            f"\nworkbench: {why} — {a.launcher} and its ranks were stopped; partial results in {out}/ "
            f"(workbench show {out})",
            file=sys.stderr,
        )
        return 130
    print_summary(run.path)
    return 0


def add_compare_arguments(cmp: argparse.ArgumentParser) -> None:
    cmp.add_argument(
        "configs",
        nargs="+",
        help='each a JSON object of RunConfig fields, e.g. \'{"dp": 2, "zero": 3}\', or a .json file',
    )
    cmp.add_argument(
        "--out", default="traces/compare", help="where the runs, table.csv and report.html go"
    )
    cmp.add_argument(
        "--force", action="store_true", help="replace the runs of an earlier comparison in --out"
    )
    cmp.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip measuring this machine (no time estimates)",
    )
    cmp.add_argument(
        "--wandb",
        nargs="?",
        const="workbench",
        default=None,
        metavar="PROJECT",
        help="also log the table to W&B as a run of its own (offline under OUT/wandb/ without a login)",
    )


def cmd_compare(a: argparse.Namespace) -> int:
    from workbench.studies.comparison import compare

    configs = []
    try:
        for text in a.configs:
            if os.path.exists(text):
                with open(text) as f:
                    text = f.read()
            configs.append(RunConfig.from_dict(json.loads(text)).validate())
    except (ConfigError, json.JSONDecodeError) as e:
        print(f"workbench: invalid configuration: {e}", file=sys.stderr)
        return 2
    hw = None
    if not a.no_calibrate:
        from workbench.studies.calibration import calibrate

        worlds = tuple(sorted({max(2, c.world_size + c.world_size % 2) for c in configs}))
        print(
            f"calibrating this machine for {max(worlds)} ranks (a few minutes: short runs, three of each; "
            f"--no-calibrate skips it) ...",
            file=sys.stderr,
            flush=True,
        )
        # the runs' own model, batch, backend and device; written to OUT/calibration.json
        hw = calibrate(
            configs[0].model,
            global_batch=configs[0].global_batch,
            backend=configs[0].backend,
            worlds=worlds,
            out=a.out,
        )
    try:
        result = compare(configs, a.out, hardware=hw, force=a.force)
    except FileExistsError as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    print(result.table.to_string(index=False))
    print(
        f"\nreport: {result.report(a.out)}  (opens in a browser, no Jupyter needed); table: {a.out}/table.csv"
    )
    if a.wandb:
        from workbench.engine.logs.wandb_log import log_table

        log_table(
            a.wandb, a.out, f"compare-{os.path.basename(os.path.abspath(a.out))}", result.table
        )
        print(
            f"W&B: the table logged to project {a.wandb!r} (offline runs: wandb sync {a.out}/wandb/offline-run-*)"
        )
    return 0
