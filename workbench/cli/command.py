"""What a `workbench` subcommand is: a row of the table in cli/parser.py.

Most subcommands are parsed by argparse: a `Command` adds its arguments to its own subparser and runs with
what was parsed. `workbench run` parses its own flags (tyro, from RunConfig's fields: cli/run_command.py):
an `ArgvCommand` is listed beside the others and handed the arguments after its name as they came.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Command:
    """A subcommand argparse parses: its name, the line `workbench --help` gives it, the function that adds
    its arguments to its subparser, and the function that runs it with them (returning the exit status)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


@dataclass(frozen=True, kw_only=True)
class ArgvCommand:
    """A subcommand that parses its own arguments: its name and its line in `workbench --help` (its subparser
    only lists it), and the function handed the arguments after its name, unparsed."""

    name: str
    help: str
    run: Callable[[list[str]], int]
