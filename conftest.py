"""pytest, for `tests/` and the notebooks (`--nbmake`): strict communication checks everywhere, notebook
claims that fail the notebook, the exercises notebook's empty cells filled with the reference answers, the
fix for a stall in jupyter_client's async channels (scripts/nbclient_poll.py says what it is), and each
executed notebook kept for the documentation site."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
try:
    from nbclient_poll import install
# a machine without Jupyter (a bare GPU image) runs tests/, no notebooks
except ModuleNotFoundError as missing:
    if missing.name not in ("jupyter_client", "zmq"):
        raise
else:
    install()


def _keep_executed_notebooks() -> None:
    """Each notebook nbmake executes without an error is kept as its executed copy (traces/executed/, read by
    `make docs`: scripts/executed_notebooks.py), so the documentation site does not execute them again."""
    try:
        from nbmake.nb_run import NotebookRun
    except ModuleNotFoundError:
        return
    from executed_notebooks import keep
    from exercise_answers import filled_in

    execute = NotebookRun.execute

    def execute_and_keep(self, *args, **kwargs):
        with (
            filled_in()
        ):  # the exercises notebook runs with its reference answers (scripts/exercise_answers.py)
            result = execute(self, *args, **kwargs)
        if result.error is None:
            keep(result.nb, self.filename)
        return result

    NotebookRun.execute = execute_and_keep


_keep_executed_notebooks()


# Strict mode for the whole suite, notebooks included (their kernels and every rank inherit it): every tensor
# handed to a collective or a transfer is checked as NCCL would check it (workbench/comm/strict.py).
os.environ["WORKBENCH_STRICT_COMM"] = "1"
# The CPU suite runs every backend='auto' launch on gloo, also on a machine with GPUs (make test-gpu asks for nccl).
os.environ["WORKBENCH_BACKEND"] = "gloo"
# Launches fork torchrun from a process that imported it once (workbench/launching/warm_torchrun.py): ~1.3 s less each.
os.environ.setdefault("WORKBENCH_WARM_TORCHRUN", "1")
# A notebook's check() (workbench/viz/check.py) prints ✓/✗ for a learner; under test a ✗ fails the notebook.
os.environ["WORKBENCH_CHECKS"] = "raise"
