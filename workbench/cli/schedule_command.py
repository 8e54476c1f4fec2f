"""`workbench schedule show|export`: a pipeline schedule as data (schedules/build.py), validated, without starting
a process — its grid and bubble, or the schedule as torch pipelining's CSV (which `--schedule csv:FILE` runs) or
JSON.

    workbench schedule show --schedule zbv --pp 2 --microbatches 4
    workbench schedule export --schedule zbh1 --out zbh1.csv

--schedule, --pp, --microbatches and --virtual-stages are RunConfig's fields (cli/config_flags.py); a pipeline
of two stages and four microbatches is shown unless they say otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from workbench.cli.config_flags import add_config_flag

if TYPE_CHECKING:
    from workbench.schedules.actions import Schedule


def add_arguments(p: argparse.ArgumentParser) -> None:
    """show|export, the schedule's RunConfig fields, and export's --format and --out."""
    p.add_argument("action", choices=("show", "export"))
    add_config_flag(p, "schedule")
    add_config_flag(p, "pp", default=2)  # a pipeline: RunConfig's one stage has no schedule to show
    add_config_flag(p, "microbatches", default=4)
    add_config_flag(p, "virtual_stages")
    p.add_argument("--format", default="torch-csv", choices=("torch-csv", "json"))
    p.add_argument("--out", default=None, help="export: the file (default: standard output)")


def run(a: argparse.Namespace) -> int:
    """The schedule built and validated (2: it cannot be built, 1: it is invalid), then shown or exported."""
    from workbench.schedules.build import (
        build_schedule,
        peak_in_flight,
        peak_pending_w,
        simulate,
        validate,
    )
    from workbench.schedules.torch_csv import csv_rows, write_csv

    try:
        s = build_schedule(a.schedule, a.pp, a.microbatches, a.virtual_stages)
    except ValueError as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    if errors := validate(s):
        print("workbench: invalid schedule: " + "; ".join(errors), file=sys.stderr)
        return 1
    if a.action == "show":
        t = simulate(s, 1.0, 2.0, t_w=1.0)
        print(s.grid())
        print(
            f"bubble rate at T_F = T_I = T_W: {t.bubble_rate():.4f}; activations in flight per rank "
            f"{peak_in_flight(s)}; weight-gradient stashes per rank {peak_pending_w(s)}"
        )
        if a.schedule in ("dualpipe", "dualpipev"):
            print(deepseek_line(s))
        return 0
    if a.format == "json":
        text = json.dumps(s.to_dict(), indent=1)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
        else:
            print(text)
        return 0
    if a.out:
        write_csv(s, a.out)
    else:
        print("\n".join(",".join(row) for row in csv_rows(s)))
    return 0


def deepseek_line(s: Schedule) -> str:
    """DeepSeek's bubble beside the simulation's idle per rank, at T_F = T_W = T_B / 2 and free transfers."""
    from workbench.predict.formulas.zero_bubble import dualpipe_bubble
    from workbench.schedules.build import simulate

    t = simulate(s, 1.0, 2.0, t_w=1.0, rule="gloo")
    idle = t.idle_per_rank()
    # DualPipe's stages are 1/p of a copy; a V's stage is half a rank's share
    stages, k = (s.p, 1.0) if s.placement == "dual" else (2 * s.p, 0.5)
    formula = dualpipe_bubble(stages, f=k, b=2 * k, w=k)
    return (
        f"idle per rank at F = W = 1, B = 2 per rank's share, free transfers: simulated {idle:g}, "
        f"DeepSeek's (PP/2 − 1)(F&B + B − 3W) with PP = {stages}: {formula:g}"
    )
