"""The `workbench` command (`python -m workbench.cli`, or the `workbench` script): parser.py holds its
subcommands as a table (command.py says what a row is) and dispatches to the function each row names."""

from workbench.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
