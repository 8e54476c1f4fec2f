"""RunConfig's fields as argparse flags, for the subcommands that take a few of them (`what-if`, `schedule`).

A field is said once, in config/run_config.py: its name, its type, its default and its comment (the `#:` lines
above it, which tyro also reads for `workbench run --help`). `add_config_flag(parser, "bucket_mb")` gives
`--bucket-mb BUCKET_MB`, of the field's type, with the field's comment as its help; a command states only what
differs for it: its own default (what-if's None, "as the run was") and a note on what the flag means there.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import typing

from workbench.config import RunConfig

#: the field types a flag here parses (argparse converts the text with them)
FLAG_TYPES: tuple[type, ...] = (int, float, str)


@functools.cache
def field_help() -> dict[str, str]:
    """Each documented RunConfig field's comment: the `#:` lines just above it, joined (read from the source of
    RunConfig and of any dataclass it extends)."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    classes = [c for c in reversed(RunConfig.__mro__) if dataclasses.is_dataclass(c)]
    helps: dict[str, str] = {}
    comment: list[str] = []
    for line in "\n".join(inspect.getsource(c) for c in classes).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            comment.append(text[2:].strip())
            continue
        name = text.split(":", 1)[0]
        if name in names and comment:
            helps[name] = " ".join(comment)
        comment = []
    return helps


def field_type(name: str) -> type:
    """The type a flag for field `name` parses: the field's annotation, less None (`str | None` → str)."""
    hint = typing.get_type_hints(RunConfig)[name]
    for kind in FLAG_TYPES:
        if hint in (kind, kind | None):
            return kind
    raise TypeError(f"RunConfig.{name}: {hint} is not one of {FLAG_TYPES} (or one of them | None)")


def field_default(name: str) -> object:
    """The field's default (RunConfig's fields that become flags here have plain ones)."""
    (field,) = [f for f in dataclasses.fields(RunConfig) if f.name == name]
    return field.default


def add_config_flag(
    parser: argparse.ArgumentParser,
    name: str,
    *,
    default: object = dataclasses.MISSING,
    note: str | None = None,
) -> None:
    """`--NAME` (underscores as dashes) for RunConfig's field `name`: the field's type and comment; its default
    the field's unless `default` is given; `note`, what the flag means to this command, after the comment."""
    text = field_help()[name] + (f"; {note}" if note else "")
    parser.add_argument(
        "--" + name.replace("_", "-"),
        type=field_type(name),
        default=field_default(name) if default is dataclasses.MISSING else default,
        help=text.replace("%", "%%"),  # argparse formats help with %
    )
