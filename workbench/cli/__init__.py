"""The `workbench` command (`python -m workbench.cli`, or the `workbench` script): parser.py builds it,
commands.py runs its subcommands."""

from workbench.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
