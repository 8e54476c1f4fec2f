"""Executed copies of the notebooks, for the documentation site (`make docs`) and `make notebooks-html`:
traces/executed/NN_name.ipynb.

`make test` already executes every notebook (pytest --nbmake): conftest.py keeps each one that ran without an
error here, so `make docs` after `make test` (CI's order) executes nothing again. A copy is current when its
cells are the committed notebook's cells and it was executed at the checkout's commit; any other copy is
executed again, here, with nbclient (the channel fix of scripts/nbclient_poll.py installed first, as for nbmake).
Uncommitted changes to workbench/ are not seen: `make docs FRESH=1` executes every notebook.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "traces" / "executed"


def _commit() -> str | None:
    """The checkout's commit, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cells(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def keep(nb: nbformat.NotebookNode, source: str | os.PathLike) -> Path:
    """Write an executed notebook as the copy of `source`, stamped with the commit it ran at."""
    FOLDER.mkdir(parents=True, exist_ok=True)
    nb.metadata["workbench_executed"] = {"commit": _commit()}
    target = FOLDER / Path(source).name
    nbformat.write(nb, target)
    return target


def current_copy(source: str | os.PathLike) -> nbformat.NotebookNode | None:
    """The executed copy of `source` when it is current (same cells, executed at this commit), else None."""
    target = FOLDER / Path(source).name
    if not target.exists():
        return None
    copy = nbformat.read(target, as_version=4)
    committed = nbformat.read(source, as_version=4)
    commit = copy.metadata.get("workbench_executed", {}).get("commit")
    if _cells(copy) != _cells(committed) or commit is None or commit != _commit():
        return None
    return copy


def executed(source: str | os.PathLike, fresh: bool = False) -> nbformat.NotebookNode:
    """The notebook `source` with its outputs: the current copy, or executed now (and kept)."""
    copy = None if fresh else current_copy(source)
    if copy is not None:
        print(f"{Path(source).name}: the copy executed by make test (traces/executed/)", flush=True)
        return copy
    from nbclient_poll import install
    from nbconvert.preprocessors import ExecutePreprocessor

    install()
    print(f"{Path(source).name}: executing…", flush=True)
    nb = nbformat.read(source, as_version=4)
    ExecutePreprocessor(timeout=900).preprocess(nb, {"metadata": {"path": str(Path(source).parent)}})
    keep(nb, source)
    return nb
