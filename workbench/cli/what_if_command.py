"""`workbench what-if RUN --dp 4 ...`: a run's trace edited into another configuration and replayed
(analysis/what_if.py), printed beside the run's measured and replayed step.

    workbench what-if traces/dp2 --dp 4
    workbench what-if traces/pp2 --schedule gpipe --microbatches 8
    workbench what-if traces/pp2 --schedule dualpipev          (or dualpipe, zbv, zbh1, interleaved)
    workbench what-if traces/dp2 --bucket-mb 0.05
    workbench what-if traces/dp2 --emulate-link 'inter=1,200' --ranks-per-node 1
    workbench what-if traces/dp2 --straggler 1 0.02

On a CPU run a dp or microbatches what-if first measures this machine's fixed cost per layer in this
process (a few seconds; `--no-calibrate` skips it and scales each action by its tokens).
"""

from __future__ import annotations

import argparse
import sys

from workbench.analysis.what_if import CHANGES
from workbench.cli.config_flags import add_config_flag

#: the what-if's changes that are RunConfig fields (analysis/what_if.CHANGES), each a flag of the field's, in the
#: order `workbench what-if --help` lists them; the straggler (a rank and its sleep) is the what-if's own
CONFIG_CHANGES = tuple(c for c in CHANGES if c != "straggler")
#: what a flag means to a what-if, beside the field's comment
NOTES = {
    "dp": "a what-if keeps the global batch",
    "microbatches": "a what-if edits it on a pipeline run (pp > 1) only",
    "schedule": "a what-if edits it on a pipeline run (pp > 1) only",
    "virtual_stages": "a what-if edits it on a pipeline run (pp > 1) only",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """RUN, a flag for each change (default None: as the run was), --straggler, --no-calibrate."""
    p.add_argument("run_dir")
    for name in CONFIG_CHANGES:
        add_config_flag(p, name, default=None, note=NOTES.get(name))
    p.add_argument(
        "--straggler",
        nargs=2,
        metavar=("RANK", "SECONDS"),
        default=None,
        help="that rank sleeps so long at the start of every step",
    )
    p.add_argument(
        "--no-calibrate",
        action="store_true",
        help="no compute measurement: actions scale by tokens",
    )


def run(a: argparse.Namespace) -> int:
    """`workbench what-if`: the changes asked for, replayed (after a calibration on a CPU run); 2 on bad input."""
    import workbench as wb
    from workbench.analysis.run import Run
    from workbench.config import ConfigError

    changes = {k: getattr(a, k) for k in CONFIG_CHANGES if getattr(a, k) is not None}
    if a.straggler:
        changes["straggler"] = (int(a.straggler[0]), float(a.straggler[1]))
    try:
        run = Run(a.run_dir)
        hardware = None
        config = run.config
        if (
            not a.no_calibrate
            and config.get("device", "cpu") == "cpu"
            and ({"dp", "microbatches"} & set(changes))
        ):
            from workbench.studies.calibration import calibrate_compute

            hardware = calibrate_compute(
                run.run_config.model_config, config["global_batch"], "gloo"
            )
        result = wb.what_if(run, hardware=hardware, **changes)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    print(result)
    for note in result.notes:
        print(f"  {note}")
    return 0
