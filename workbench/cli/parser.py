"""The `workbench` command.

    workbench run --dp 2 --steps 20 --model tiny --global-batch 16 --seed 0 --out traces/dp2
    workbench run --dp 2 --allreduce ring --bucket-mb 0.05 --out traces/ring
    workbench run --dp 8 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500   # on each machine
    workbench validate traces/dp2        # check the traces against docs/run-format.md
    workbench show traces/dp2            # the summary: step time, overlap, memory measured vs predicted
    workbench report traces/dp2          # its charts in one HTML file: traces/dp2/report.html
    workbench compare '{"dp": 2}' '{"dp": 2, "zero": 3}' --out traces/compare   # table.csv + report.html
    workbench what-if traces/dp2 --dp 4  # the run's trace edited and replayed (cli/what_if_command.py)

`workbench run`'s flags are RunConfig's fields (cli/run_command.py); the other subcommands are parsed here.
A bad configuration is reported (exit code 2) before any process starts.
"""

from __future__ import annotations

import argparse
import sys


def _add_other_commands(sub: argparse._SubParsersAction) -> None:
    """compare, validate, show, doctor, merge, report, schedule, checkpoint, sample."""
    cmp = sub.add_parser("compare", help="run several configurations and compare them side by side")
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

    for name, text in (
        ("validate", "check a run's traces against the run format"),
        ("show", "print a run's summary"),
        ("doctor", "why a run failed: the first cause, and who was behind at which collective"),
        ("merge", "rebuild a run's trace.json from its per-rank traces (a rank's from its stream)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("run_dir")
    rpt = sub.add_parser(
        "report", help="one run's charts in a self-contained HTML file (RUN/report.html)"
    )
    rpt.add_argument("run_dir")
    rpt.add_argument("--out", default=None, help="where the HTML goes (default RUN/report.html)")
    sch = sub.add_parser(
        "schedule",
        help="a pipeline schedule as data: show its grid and bubble, or export it "
        "(torch-csv: torch pipelining's CSV, which --schedule csv:FILE runs)",
    )
    sch.add_argument("action", choices=("show", "export"))
    sch.add_argument(
        "--schedule", default="1f1b", help="gpipe, 1f1b, interleaved, zbh1, zbv or csv:FILE"
    )
    sch.add_argument("--pp", type=int, default=2)
    sch.add_argument("--microbatches", type=int, default=4)
    sch.add_argument("--virtual-stages", type=int, default=1)
    sch.add_argument("--format", default="torch-csv", choices=("torch-csv", "json"))
    sch.add_argument("--out", default=None, help="export: the file (default: standard output)")
    ckpt = sub.add_parser(
        "checkpoint",
        help="what a checkpoint holds (inspect), whether its bytes are intact (verify)",
    )
    ckpt.add_argument("action", choices=("inspect", "verify"))
    ckpt.add_argument(
        "path", help="a checkpoint (RUN/checkpoints/step_N); verify: also a run or its checkpoints/"
    )
    smp = sub.add_parser(
        "sample",
        help="text from a trained model: a run's newest checkpoint (or one checkpoint), "
        "any layout, read on this one process",
    )
    smp.add_argument(
        "path", help="a run directory, its checkpoints/ or one checkpoint (RUN/checkpoints/step_N)"
    )
    smp.add_argument(
        "--prompt",
        default="",
        help="where the text starts (token ids, space-separated, for data "
        "without a tokenizer here); default: a newline, or token 0",
    )
    smp.add_argument(
        "--tokens", type=int, default=200, help="how many tokens to sample (default: 200)"
    )
    smp.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="logits ÷ T; 0: the likeliest token (default: 0.8)",
    )
    smp.add_argument(
        "--top-k", type=int, default=None, help="draw only among the K likeliest tokens"
    )
    smp.add_argument(
        "--seed", type=int, default=0, help="the draws' seed: equal seeds, equal samples"
    )


def build_parser() -> argparse.ArgumentParser:
    """The subcommands; `run`'s flags are generated from RunConfig (cli/run_command.py: `workbench run --help`)."""
    from workbench import __version__
    from workbench.cli import what_if_command

    parser = argparse.ArgumentParser(
        prog="workbench", description="Run and profile distributed training."
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "run",
        help="launch a training run with torchrun (every RunConfig field is a flag: "
        "workbench run --help)",
        add_help=False,
    )
    _add_other_commands(sub)
    what_if_command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from workbench.cli.commands import (
        cmd_compare,
        cmd_merge,
        cmd_report,
        cmd_run,
        cmd_schedule,
        cmd_show,
    )

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["run"]:
        return cmd_run(argv[1:])
    a = build_parser().parse_args(argv)
    if a.command == "validate":
        from workbench.trace.validate import validate_run

        errors = validate_run(a.run_dir)
        for e in errors:
            print(e)
        print(f"{a.run_dir}: {'valid' if not errors else f'{len(errors)} problem(s)'}")
        return 1 if errors else 0
    if a.command == "compare":
        return cmd_compare(a)
    if a.command == "what-if":
        from workbench.cli import what_if_command

        return what_if_command.run(a)
    if a.command == "show":
        return cmd_show(a.run_dir)
    if a.command == "merge":
        return cmd_merge(a.run_dir)
    if a.command == "report":
        return cmd_report(a.run_dir, a.out)
    if a.command == "schedule":
        return cmd_schedule(a)
    if a.command == "doctor":
        from workbench.analysis.doctor import diagnose

        print(diagnose(a.run_dir))
        return 0
    if a.command == "sample":
        from workbench.config import ConfigError
        from workbench.engine.checkpoint.files import CheckpointError
        from workbench.engine.sample import sample

        try:
            s = sample(a.path, a.prompt, a.tokens, a.temperature, a.top_k, a.seed)
        except (CheckpointError, ConfigError) as e:
            print(f"workbench: {e}", file=sys.stderr)
            return 2
        print(f"[{s.checkpoint}: the model before step {s.step}]", file=sys.stderr)
        print(s.text)
        return 0
    if a.command == "checkpoint" and a.action == "verify":
        from workbench.engine.checkpoint.files import verify_all

        results = verify_all(a.path)
        for path, problem in results:
            print(f"{path}: {problem or 'good (sizes and CRC32 checksums)'}")
        if not results:
            print(f"{a.path}: no checkpoint here")
        return 1 if not results or any(p and p.startswith("BAD") for _, p in results) else 0
    if a.command == "checkpoint":
        from workbench.engine.checkpoint.files import CheckpointError
        from workbench.engine.checkpoint.save_load import describe

        try:
            print(describe(a.path))
        except CheckpointError as e:
            print(f"workbench: {e}", file=sys.stderr)
            return 1
        return 0
    return 2
