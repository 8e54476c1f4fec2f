"""The GPU check (scripts/gpu_check.py) rehearsed on the CPU: every section's real command at tiny sizes, under a
fresh virtualenv holding only what the GPU machine's image lists and what the check carries — so an import the GPU
machine lacks, a flag a script no longer takes or a section that writes no row is found here, not in the one call a
borrowed GPU gives. Each section's estimated time on one H100 must fit its bound, and the whole check 8 minutes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402


def test_the_rehearsal_runs_every_section_and_each_fits_its_bound(tmp_path):
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--rehearse"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "OUT": str(tmp_path), "PY": sys.executable},
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    rows = [line.split("\t") for line in (tmp_path / "sections.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == [
        "preflight",
        *(s.name for s in gpu_check.SECTIONS),
        "the whole check",
    ]
    assert rows[0][1].startswith("passed")
    for name, state, _, _, estimate in rows[1:-1]:
        assert state == "passed", (name, state)
        assert estimate.endswith(": fits"), (name, estimate)
    assert rows[-1][1].endswith("fits"), rows[-1]
    summary = (tmp_path / "summary.txt").read_text()
    assert (
        "tiny eager             ours fast / plain" in summary and "cli run (12 steps" in summary
    ), summary
    assert not (tmp_path / "venv").exists(), "the rehearsal's virtualenv is removed"


def test_the_rehearsal_s_virtualenv_lacks_what_the_gpu_machine_lacks(tmp_path):
    """A package this project's venv has and the GPU image does not (JupyterLab's server, ruff) does not import
    in the rehearsal's virtualenv; torch and the carried CLI's tyro do."""
    py = gpu_check.fresh_venv(tmp_path / "venv")
    probe = "import importlib.util as u; print([bool(u.find_spec(m)) for m in ('torch', 'tyro', 'jupyterlab', 'ruff')])"
    got = subprocess.run(
        [py, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert got == "[True, True, False, False]", got


def test_a_section_cut_at_its_bound_keeps_every_row_before_it(tmp_path):
    """The summary is rewritten after each section: a call cut during the next one still returns these rows."""
    check = gpu_check.Check(tmp_path, sys.executable, rehearse=True)
    quick = gpu_check.Section("quick", 30, [], ["PY", "-c", "print('done')"])
    stuck = gpu_check.Section("stuck", 1, [], ["PY", "-c", "import time; time.sleep(30)"])
    check.run(quick)
    assert "quick" in (tmp_path / "summary.txt").read_text()
    check.run(stuck)
    rows = [line.split("\t")[:2] for line in (tmp_path / "sections.tsv").read_text().splitlines()]
    assert rows == [["quick", "passed"], ["stuck", "cut at its bound"]]
    assert "stuck" in (tmp_path / "summary.txt").read_text()


@pytest.mark.parametrize("missing", ["cc", "headers"])
def test_compiling_sections_wait_for_triton_s_toolchain(tmp_path, monkeypatch, missing):
    if missing == "cc":
        monkeypatch.setattr(gpu_check.shutil, "which", lambda name: None)
    else:
        monkeypatch.setattr(
            gpu_check.sysconfig, "get_paths", lambda: {"include": str(tmp_path / "none")}
        )
    check = gpu_check.Check(tmp_path, sys.executable, rehearse=True)
    compiled = next(s for s in gpu_check.SECTIONS if s.name == "headline compiled")
    check.run(compiled)
    state = (tmp_path / "sections.tsv").read_text().split("\t")[1]
    assert (
        state.startswith("not run: --compile needs")
        and ("C compiler" if missing == "cc" else "headers") in state
    )
