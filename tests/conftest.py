"""Shared fixtures: real runs launched with torchrun, cached for the whole session.

`launched(**config)` starts a run once per distinct configuration and returns the loaded Run; tests
that read the same run (the dp=2 trace, its summary, its memory) share one launch.
"""

from __future__ import annotations

import json
import os

import pytest

import workbench as wb

os.environ.setdefault("OMP_NUM_THREADS", "1")
#: the CPU suite: every backend='auto' launch runs on gloo, on a machine with GPUs too (make test-gpu asks for
#: nccl by name); every tensor handed to communication is checked as NCCL would check it (comm/strict.py)
os.environ["WORKBENCH_BACKEND"] = "gloo"
os.environ["WORKBENCH_STRICT_COMM"] = "1"

#: Short runs keep the suite fast; 6 steps are enough for Adam's state to matter in the comparison.
STEPS = 6
#: Process-group timeout in tests: short, so a broken test fails in seconds, not 30 minutes.
TIMEOUT_S = 30.0


@pytest.fixture(scope="session")
def launched(tmp_path_factory):
    cache: dict[str, wb.Run] = {}
    root = tmp_path_factory.mktemp("runs")

    def run(**kwargs) -> wb.Run:
        kwargs.setdefault("steps", STEPS)
        kwargs.setdefault("timeout_s", TIMEOUT_S)
        config = wb.RunConfig(**kwargs)
        key = json.dumps(config.to_dict(), sort_keys=True)
        if key not in cache:
            cache[key] = wb.launch(config, out=str(root / f"run{len(cache)}"), progress=False)
        return cache[key]

    return run


@pytest.fixture(scope="session", autouse=True)
def no_cluster_left_behind():
    """Every local cluster this test process brought up is gone after the suite (launching/local_cluster.py):
    one left over is removed, and the suite fails saying which."""
    from workbench.launching import local_cluster

    yield
    left = local_cluster.owned_by(os.getpid())
    for name in left:
        local_cluster.down(name)
    assert not left, f"clusters left up after the suite (now removed): {left}"


def pytest_terminal_summary(terminalreporter):
    """What the cluster cases measured, shown at the end of the suite (tests/cluster_skip.REPORTED)."""
    from tests.cluster_skip import REPORTED

    if REPORTED:
        terminalreporter.section("measured on a local cluster")
        for line in REPORTED:
            terminalreporter.write_line(line)
