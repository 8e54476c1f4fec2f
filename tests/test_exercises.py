"""The exercises' framework (workbench/exercises/): bad submissions are refused before anything runs, saying
what the exercise wants; a failed Result raises only when shown under test; the notebook ships its exercise
cells empty, one per exercise, with the package's stubs, and its test fills them with answers of the same
names; the notebook never shows an answer."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

import workbench as wb
from workbench.exercises import EXERCISES, answers
from workbench.exercises.result import ExerciseFailed, Result

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "13_exercises.ipynb"
sys.path.insert(0, str(ROOT / "scripts"))
from exercise_answers import exercise_of, fill  # noqa: E402


def test_an_unknown_exercise_names_the_valid_ones():
    with pytest.raises(KeyError, match="valid are .*'ring'"):
        wb.exercises.check("rnig", answers.ring_all_reduce)


@pytest.mark.parametrize(
    ("solution", "says"),
    [
        (42, "expected a function like `def ring_all_reduce(ring, chunks): ...`, got int"),
        (lambda ring, chunks: None, "not a lambda"),
        (lambda ring: None, "your function takes (ring); the exercise calls it with 2 arguments"),
        (print, "the exercise calls it with 2 arguments"),
    ],
)
def test_a_submission_that_is_not_such_a_function_is_refused_before_anything_runs(solution, says):
    result = wb.exercises.check("ring", solution)
    assert not result.passed and result.stage == "validate"
    assert says in result.message


def test_a_failed_result_raises_only_when_shown_under_test(monkeypatch):
    failed = Result(exercise="ring", passed=False, stage="validate", message="wrong")
    passed = Result(exercise="ring", passed=True, stage="passed", message="right")
    monkeypatch.setenv("WORKBENCH_CHECKS", "raise")
    passed._ipython_display_()
    with pytest.raises(ExerciseFailed, match="✗ ring: wrong"):
        failed._ipython_display_()
    monkeypatch.setenv("WORKBENCH_CHECKS", "print")
    failed._ipython_display_()


def _defined_name(source: str) -> str:
    first = source.strip().splitlines()[0]
    return first.split("(")[0].removeprefix("def ").split("=")[0].strip()


@pytest.mark.parametrize("name", list(EXERCISES))
def test_each_answer_defines_what_its_stub_defines(name):
    assert _defined_name(answers.source(name)) == _defined_name(EXERCISES[name].stub)


def test_the_notebook_ships_one_empty_cell_per_exercise_and_its_test_fills_them():
    nb = nbformat.read(NOTEBOOK, 4)
    tagged = {exercise_of(c): c.source for c in nb.cells if exercise_of(c)}
    assert list(tagged) == list(EXERCISES)
    assert all(tagged[n] == EXERCISES[n].stub.strip() for n in tagged)
    filled = {exercise_of(c): c.source for c in fill(nb).cells if exercise_of(c)}
    assert all(filled[n] == answers.source(n) for n in filled)


def test_the_notebook_never_shows_an_answer():
    text = "\n".join(c.source for c in nbformat.read(NOTEBOOK, 4).cells)
    code = "\n".join(c.source for c in nbformat.read(NOTEBOOK, 4).cells if c.cell_type == "code")
    assert "answers" not in code  # no cell imports or prints them
    for name in EXERCISES:
        stub = EXERCISES[name].stub
        body = [line for line in answers.source(name).splitlines() if line.strip() not in stub]
        assert not any(line.strip() in text for line in body if line.strip()), name


def test_a_reference_run_is_reused_only_from_its_own_folder_while_it_holds_it(tmp_path):
    """The reference answer's run is launched once per folder: asked again into the same folder it is the same
    run; into another folder, or once something else has written into its folder, it is launched again."""
    import os
    import time

    from workbench.config import RunConfig
    from workbench.exercises.ranks import run_on_ranks

    def reference(folder: str):
        config = RunConfig(dp=2, global_batch=2)
        settings = {"label": "reference"}
        return run_on_ranks("ring", config=config, solution=None, settings=settings, out=folder)

    first = reference(str(tmp_path / "a"))
    assert reference(str(tmp_path / "a")) is first, "reused from its folder"
    elsewhere = reference(str(tmp_path / "b"))
    assert elsewhere is not first and elsewhere.path == str(tmp_path / "b")
    time.sleep(0.01)
    os.utime(tmp_path / "a" / "exercise_rank0.json")  # another check wrote into the folder
    assert reference(str(tmp_path / "a")) is not first


def _from_a_cell(tmp_path, source: str, name: str):
    """A function defined as a notebook cell defines it: its own globals (here: none but builtins)."""
    import importlib.util

    path = tmp_path / f"{name}_cell.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{name}_cell", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


class _Launched(Exception):
    """What the tests' stand-in for run_on_ranks raises: validation passed, a launch was asked for."""


def test_a_function_using_torch_passes_validation_though_its_cell_never_imported_torch(
    tmp_path, monkeypatch
):
    from workbench.exercises import grading

    def launch(*_args, **_kw):
        raise _Launched

    monkeypatch.setattr(grading, "run_on_ranks", launch)
    ring = _from_a_cell(
        tmp_path,
        "def ring_all_reduce(ring, chunks):\n"
        "    n, i = ring.n, ring.rank\n"
        "    for k in range(n - 1):\n"
        "        chunks[(i - k - 1) % n] += ring.exchange(torch.clone(chunks[(i - k) % n]))\n"
        "    for k in range(n - 1):\n"
        "        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))\n",
        "ring_all_reduce",
    )
    assert "torch" not in ring.__globals__  # its cell never imported torch…
    with pytest.raises(_Launched):  # …and the check runs it as the ranks do, with torch
        wb.exercises.check("ring", ring, out=str(tmp_path / "out"))


def test_a_name_error_on_the_ranks_says_what_globals_the_function_has(tmp_path, monkeypatch):
    from workbench.exercises import grading
    from workbench.launching.launcher import RunFailed

    def launch(*_args, **_kw):
        raise RunFailed(  # as the launcher words it
            "rank 0 failed: NameError: name 'helper' is not defined\n(run directory kept: /run)",
            0,
            'File "/run/solution.py", line 2, in ring_all_reduce\n    helper()\n'
            "NameError: name 'helper' is not defined",
            None,  # type: ignore[arg-type]
        )

    monkeypatch.setattr(grading, "run_on_ranks", launch)
    result = wb.exercises.check("ring", answers.ring_all_reduce, out=str(tmp_path))
    assert result.stage == "run"
    assert result.message.startswith("rank 0 failed: NameError: name 'helper' is not defined")
    assert result.message.endswith(
        "your function runs with only torch and math as its globals (on the ranks too): define or import "
        "what it uses inside it"
    )


def test_the_simulated_ranks_share_one_deadline(monkeypatch):
    import threading
    import time

    from workbench.exercises import simulated_ranks

    monkeypatch.setattr(simulated_ranks, "DEADLINE_S", 1.0)
    release = threading.Event()
    began = time.monotonic()
    try:
        errors = simulated_ranks.run_ranks(lambda _r: release.wait(), 4)
    finally:
        release.set()
    assert time.monotonic() - began < 2.5  # one second for all four, not one each
    assert sorted(errors) == [0, 1, 2, 3]
    assert str(errors[2]) == (
        "rank 2 did not return within 1 s: a loop that does not end? (it still runs in this kernel; "
        "restart the kernel)"
    )


def test_a_loaded_solutions_traceback_shows_its_lines():
    from workbench.exercises.simulated_ranks import your_lines
    from workbench.exercises.submission import load

    fn = load("def f(x):\n    y = x + 1\n    return y / 0\n\n\nSOLUTION = f\n")
    with pytest.raises(ZeroDivisionError) as e:
        fn(1)
    assert your_lines(e.value, fn) == "line 3 of your function: return y / 0"
