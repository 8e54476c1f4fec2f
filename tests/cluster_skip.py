"""Whether the cluster cases run here: a local cluster (launching/local_cluster.py) must be possible, and they run
as root, as CI does (the unprivileged path, a holder's user namespace, is tested as such in test_local_cluster.py).
Elsewhere they skip, saying why."""

from __future__ import annotations

import os

import pytest

from workbench.launching import local_cluster

WHY_NOT = local_cluster.available() or (
    None if os.geteuid() == 0 else "the cluster cases run as root (as CI does)"
)
needs_cluster = pytest.mark.skipif(WHY_NOT is not None, reason=f"no local cluster here: {WHY_NOT}")
#: lines a cluster case measured (a lost node's detection and recovery times), which tests/conftest.py prints in
#: the suite's summary: pytest keeps a passing test's own output to itself
REPORTED: list[str] = []
