"""Each notebook is written by its builder (scripts/build_notebook_NN.py; docs/changing-a-notebook.md says how to
change one): built again into a temporary folder, every committed notebook has the builder's cells — their kinds and
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


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """Every builder run once, in one process (each writes its notebook into a temporary folder)."""
    out = tmp_path_factory.mktemp("notebooks")
    runner = (
        "import runpy, sys\nsys.path.insert(0, 'scripts')\n"
        "for path in sys.argv[1:]:\n    runpy.run_path(path, run_name='__main__')\n"
    )
    env = {**os.environ, "WORKBENCH_NOTEBOOKS_OUT": str(out)}
    subprocess.run(
        [sys.executable, "-c", runner, *map(str, BUILDERS)], env=env, check=True, cwd=ROOT
    )
    return out


@pytest.mark.parametrize("builder", BUILDERS, ids=lambda p: p.stem)
def test_the_committed_notebook_is_what_its_builder_writes(builder, built):
    (notebook,) = [p for p in built.glob("*.ipynb") if p.name[:2] == builder.stem[-2:]]
    committed = ROOT / "notebooks" / notebook.name
    assert committed.exists(), f"{builder.name} writes {notebook.name}, which is not committed"
    assert cells(committed) == cells(notebook), (
        f"{committed.name} differs from {builder.name}: run the builder"
    )
    kernel = json.loads(committed.read_text())["metadata"]["kernelspec"]
    assert kernel["name"] == "workbench", (
        f"{committed.name} names the kernel {kernel['name']!r}, not setup's workbench"
    )
