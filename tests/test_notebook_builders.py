"""Each notebook is written by its builder (scripts/build_notebook_NN.py, docs/notebooks.md says how to change
one): built again into a temporary folder, every committed notebook has the builder's cells — their kinds and
sources, in order. A notebook edited in JupyterLab and not in its builder fails here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILDERS = sorted((ROOT / "scripts").glob("build_notebook_*.py"))


def cells(path: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(path.read_text())["cells"]]


def test_every_notebook_has_a_builder():
    notebooks = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks == sorted(p.stem[-2:] for p in BUILDERS)


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda p: p.stem)
def test_the_committed_notebook_is_what_its_builder_writes(builder, tmp_path):
    env = {**os.environ, "WORKBENCH_NOTEBOOKS_OUT": str(tmp_path)}
    subprocess.run([sys.executable, str(builder)], env=env, check=True, cwd=ROOT)
    (built,) = tmp_path.glob("*.ipynb")
    committed = ROOT / "notebooks" / built.name
    assert committed.exists(), f"{builder.name} writes {built.name}, which is not committed"
    assert cells(committed) == cells(built), f"{committed.name} differs from {builder.name}: run the builder"
