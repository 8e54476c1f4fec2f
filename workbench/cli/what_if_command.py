"""`workbench what-if RUN --dp 4 ...`: a run's trace edited into another configuration and replayed
(analysis/what_if.py), printed beside the run's measured and replayed step.

    workbench what-if traces/dp2 --dp 4
    workbench what-if traces/pp2 --schedule gpipe --microbatches 8
    workbench what-if traces/dp2 --bucket-mb 0.05
    workbench what-if traces/dp2 --emulate-link 'inter=1,200' --ranks-per-node 1
    workbench what-if traces/dp2 --straggler 1 0.02

On a CPU run a dp or microbatches what-if first measures this machine's fixed cost per layer in this
process (a few seconds; `--no-calibrate` skips it and scales each action by its tokens).
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "what-if", help="predict a run in another configuration by replaying its edited trace"
    )
    p.add_argument("run_dir")
    p.add_argument(
        "--dp", type=int, default=None, help="data-parallel replicas (the global batch kept)"
    )
    p.add_argument("--microbatches", type=int, default=None, help="a pipeline run's micro-batches")
    p.add_argument(
        "--schedule",
        default=None,
        help="a pipeline run's schedule: gpipe, 1f1b, interleaved, zbh1, zbv",
    )
    p.add_argument("--virtual-stages", type=int, default=None, help="interleaved: chunks per rank")
    p.add_argument(
        "--bucket-mb", type=float, default=None, help="data-parallel gradient bucket size, MB"
    )
    p.add_argument(
        "--emulate-link", default=None, help="emulated links, as `workbench run --emulate-link`"
    )
    p.add_argument("--ranks-per-node", type=int, default=None, help="ranks per emulated machine")
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
    import workbench as wb
    from workbench.analysis.run import Run
    from workbench.config import ConfigError

    changes = {
        k: v
        for k, v in {
            "dp": a.dp,
            "microbatches": a.microbatches,
            "schedule": a.schedule,
            "virtual_stages": a.virtual_stages,
            "bucket_mb": a.bucket_mb,
            "emulate_link": a.emulate_link,
            "ranks_per_node": a.ranks_per_node,
        }.items()
        if v is not None
    }
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
