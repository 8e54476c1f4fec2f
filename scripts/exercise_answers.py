"""The exercises notebook's empty cells filled with the reference answers — what its test runs (conftest.py:
nbmake reads the notebook through `filled_in`) and what the browser suite opens, since the notebook as shipped
keeps them empty. A cell to fill carries the tag `exercise:<name>`; its source becomes
`workbench.exercises.answers.source(name)`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import nbformat

TAG = "exercise:"


def exercise_of(cell) -> str | None:
    """The exercise a cell is the empty answer of, or None."""
    for tag in cell.get("metadata", {}).get("tags", []):
        if tag.startswith(TAG):
            return tag[len(TAG) :]
    return None


def fill(nb):
    """`nb` with each exercise cell's source replaced by the reference answer (in place; returned)."""
    from workbench.exercises import answers

    for cell in nb.cells:
        name = exercise_of(cell)
        if name is not None:
            cell.source = answers.source(name)
    return nb


@contextmanager
def filled_in() -> Iterator[None]:
    """While inside: nbformat.read returns notebooks with their exercise cells filled (nbmake reads each
    notebook once, at the start of its run)."""
    read = nbformat.read

    def read_filled(*args, **kwargs):
        return fill(read(*args, **kwargs))

    nbformat.read = read_filled
    try:
        yield
    finally:
        nbformat.read = read
