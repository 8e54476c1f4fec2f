"""The `workbench` command: its subcommands as a table, each row declared once — its name, its line in
`workbench --help`, its arguments and the function that runs it.

    workbench run --dp 2 --steps 20 --model tiny --global-batch 16 --seed 0 --out traces/dp2
    workbench run --dp 2 --allreduce ring --bucket-mb 0.05 --out traces/ring
    workbench run --dp 8 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500   # on each machine
    workbench validate traces/dp2        # check the traces against docs/run-format.md
    workbench show traces/dp2            # the summary: step time, overlap, memory measured vs predicted
    workbench report traces/dp2          # its charts in one HTML file: traces/dp2/report.html
    workbench compare '{"dp": 2}' '{"dp": 2, "zero": 3}' --out traces/compare   # table.csv + report.html
    workbench what-if traces/dp2 --dp 4  # the run's trace edited and replayed (cli/what_if_command.py)

`workbench run`'s flags are RunConfig's fields (cli/run_command.py, by tyro); the other subcommands are parsed
by argparse, `what-if`'s and `schedule`'s RunConfig flags taken from RunConfig's fields (cli/config_flags.py).
A bad configuration is reported (exit code 2) before any process starts.
"""

from __future__ import annotations

import argparse
import sys

from workbench.cli import (
    checkpoint_commands,
    cluster_command,
    commands,
    run_dir_commands,
    schedule_command,
    slurm_command,
    what_if_command,
)
from workbench.cli.command import ArgvCommand, Command

#: every subcommand, in the order `workbench --help` lists them
COMMANDS: tuple[Command | ArgvCommand, ...] = (
    ArgvCommand(
        name="run",
        help="launch a training run with torchrun (every RunConfig field is a flag: "
        "workbench run --help)",
        run=commands.cmd_run,
    ),
    Command(
        name="cluster",
        help="a cluster on this machine: nodes as network namespaces joined by shaped links "
        "(up, down, status); workbench run --cluster NAME runs across it",
        add_arguments=cluster_command.add_arguments,
        run=cluster_command.run,
    ),
    ArgvCommand(
        name="slurm-script",
        help="the sbatch script that runs a run on Slurm, one torchrun agent per node "
        "(workbench run's flags, --nnodes the job's nodes)",
        run=slurm_command.run,
    ),
    Command(
        name="compare",
        help="run several configurations and compare them side by side",
        add_arguments=commands.add_compare_arguments,
        run=commands.cmd_compare,
    ),
    Command(
        name="validate",
        help="check a run's traces against the run format",
        add_arguments=run_dir_commands.add_run_dir,
        run=run_dir_commands.validate,
    ),
    Command(
        name="show",
        help="print a run's summary",
        add_arguments=run_dir_commands.add_run_dir,
        run=run_dir_commands.show,
    ),
    Command(
        name="doctor",
        help="why a run failed: the first cause, and who was behind at which collective",
        add_arguments=run_dir_commands.add_run_dir,
        run=run_dir_commands.doctor,
    ),
    Command(
        name="merge",
        help="rebuild a run's trace.json from its per-rank traces (a rank's from its stream)",
        add_arguments=run_dir_commands.add_run_dir,
        run=run_dir_commands.merge,
    ),
    Command(
        name="report",
        help="one run's charts in a self-contained HTML file (RUN/report.html)",
        add_arguments=run_dir_commands.add_report_arguments,
        run=run_dir_commands.report,
    ),
    Command(
        name="schedule",
        help="a pipeline schedule as data: show its grid and bubble, or export it "
        "(torch-csv: torch pipelining's CSV, which --schedule csv:FILE runs)",
        add_arguments=schedule_command.add_arguments,
        run=schedule_command.run,
    ),
    Command(
        name="checkpoint",
        help="what a checkpoint holds (inspect), whether its bytes are intact (verify)",
        add_arguments=checkpoint_commands.add_checkpoint_arguments,
        run=checkpoint_commands.checkpoint,
    ),
    Command(
        name="sample",
        help="text from a trained model: a run's newest checkpoint (or one checkpoint), "
        "any layout, read on this one process",
        add_arguments=checkpoint_commands.add_sample_arguments,
        run=checkpoint_commands.sample,
    ),
    Command(
        name="what-if",
        help="predict a run in another configuration by replaying its edited trace",
        add_arguments=what_if_command.add_arguments,
        run=what_if_command.run,
    ),
)
#: the subcommands argparse parses, and those handed their arguments unparsed, by name
PARSED = {c.name: c for c in COMMANDS if isinstance(c, Command)}
OWN_PARSER = {c.name: c for c in COMMANDS if isinstance(c, ArgvCommand)}


def build_parser() -> argparse.ArgumentParser:
    """A subparser for each row of COMMANDS; `run`'s lists it only (its flags: `workbench run --help`)."""
    from workbench import __version__

    parser = argparse.ArgumentParser(
        prog="workbench", description="Run and profile distributed training."
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        if isinstance(command, ArgvCommand):
            sub.add_parser(command.name, help=command.help, add_help=False)
        else:
            command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand `argv` names (default: the command line's); its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in OWN_PARSER:
        return OWN_PARSER[argv[0]].run(argv[1:])
    a = build_parser().parse_args(argv)
    return PARSED[a.command].run(a)
