"""The `workbench` command's subcommands, declared once in a table (cli/parser.py), and the RunConfig fields that
`what-if` and `schedule` take as flags, each saying what the field says (cli/config_flags.py)."""

import argparse
import dataclasses

from workbench.cli import what_if_command
from workbench.cli.config_flags import field_help, field_type
from workbench.cli.parser import COMMANDS, build_parser, main
from workbench.config import RunConfig

SCHEDULE_FIELDS = ("schedule", "pp", "microbatches", "virtual_stages")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_workbench_help_lists_the_table_in_its_order():
    names = [c.name for c in COMMANDS]
    assert names == [
        "run",
        "cluster",
        "slurm-script",
        "compare",
        "validate",
        "show",
        "doctor",
        "merge",
        "report",
        "schedule",
        "checkpoint",
        "sample",
        "what-if",
    ]
    assert list(_subparsers()) == names
    assert "{" + ",".join(names) + "}" in build_parser().format_help()


def test_every_run_config_field_has_the_help_run_shows():
    assert set(field_help()) == {f.name for f in dataclasses.fields(RunConfig)}
    assert field_help()["dp"].startswith("data-parallel ranks")


def test_what_if_and_schedule_flags_are_run_config_fields():
    parsers = _subparsers()
    for command, fields in (
        ("what-if", what_if_command.CONFIG_CHANGES),
        ("schedule", SCHEDULE_FIELDS),
    ):
        actions = {a.dest: a for a in parsers[command]._actions}
        for name in fields:
            flag = actions[name]
            assert flag.option_strings == ["--" + name.replace("_", "-")]
            assert flag.type is field_type(name)
            assert flag.help is not None and flag.help.startswith(field_help()[name]), (
                command,
                name,
            )
    what_if = parsers["what-if"].parse_args(["RUN"])
    assert all(getattr(what_if, name) is None for name in what_if_command.CONFIG_CHANGES)
    schedule = parsers["schedule"].parse_args(["show"])
    assert (schedule.schedule, schedule.pp, schedule.microbatches, schedule.virtual_stages) == (
        "1f1b",
        2,
        4,
        1,
    )


def test_a_subcommand_runs_by_its_name(capsys):
    assert main(["schedule", "show", "--schedule", "gpipe"]) == 0
    assert "bubble rate" in capsys.readouterr().out
