"""Executed copies of the notebooks, for the documentation site (`make docs`): traces/executed/NN_name.ipynb.

`make test` already executes every notebook (pytest --nbmake): conftest.py keeps each one that ran without an
error here, so `make docs` after `make test` (CI's order) executes nothing again. A copy is current when its
cells are the notebook's cells and it was written after the last change to workbench/'s sources; any other is
executed again, here, with nbclient (the channel fix of scripts/nbclient_poll.py installed first, as for nbmake).
`make docs FRESH=1` executes every notebook. The exercises notebook runs with its reference answers filled in, as
under test (scripts/exercise_answers.py); the site folds each answer away.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import nbformat
from exercise_answers import fill

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "traces" / "executed"


@functools.cache  # once a build: executing a notebook does not change workbench/
def _sources_changed_at() -> float:
    """When workbench/'s newest source file was written: a copy older than that may show what the code no longer
    does."""
    return max(p.stat().st_mtime for p in (ROOT / "workbench").rglob("*.py"))


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def keep(nb: nbformat.NotebookNode, source: str | os.PathLike) -> Path:
    """Write an executed notebook as the copy of `source`."""
    FOLDER.mkdir(parents=True, exist_ok=True)
    target = FOLDER / Path(source).name
    nbformat.write(nb, target)
    return target


def current_copy(source: str | os.PathLike) -> nbformat.NotebookNode | None:
    """The executed copy of `source` when it is current (the same cells, written after workbench/'s last change),
    else None."""
    target = FOLDER / Path(source).name
    if not target.exists() or target.stat().st_mtime < _sources_changed_at():
        return None
    copy = nbformat.read(target, as_version=4)
    # the exercises notebook ran with its answers filled in (scripts/exercise_answers.py)
    return copy if _cells(copy) == _cells(fill(nbformat.read(source, as_version=4))) else None


def executed(source: str | os.PathLike, fresh: bool = False) -> nbformat.NotebookNode:
    """The notebook `source` with its outputs: the current copy, or executed now (and kept)."""
    copy = None if fresh else current_copy(source)
    if copy is not None:
        print(f"{Path(source).name}: its current executed copy (traces/executed/)", flush=True)
        return copy
    from nbclient_poll import install
    from nbconvert.preprocessors import ExecutePreprocessor

    install()
    print(f"{Path(source).name}: executing…", flush=True)
    nb = fill(nbformat.read(source, as_version=4))
    ExecutePreprocessor(timeout=900).preprocess(
        nb, {"metadata": {"path": str(Path(source).parent)}}
    )
    keep(nb, source)
    return nb
