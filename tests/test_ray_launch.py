"""`--launcher ray`: the ranks as Ray Train workers (workbench/launching/ray_launch.py). What fails before anything
starts is in make test; a dp = 2 run under a local Ray equal to torchrun's loss for loss, and a SIGTERM that
leaves no Ray process behind, are in make test-all (which installs Ray)."""

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

import workbench as wb
from tests.cluster_skip import needs_cluster
from tests.test_launcher import _alive, _descendants
from workbench import ConfigError, RunConfig
from workbench.launching.launcher import Nodes


def test_what_ray_cannot_do_fails_before_anything_starts(monkeypatch, tmp_path):
    out = tmp_path / "r"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name.startswith("ray") else real(name, *a),
    )
    with pytest.raises(
        ConfigError, match=r"Ray Train is not installed here; pip install 'ray\[train\]'"
    ):
        wb.launch(RunConfig(dp=2), out=str(out), progress=False, launcher="ray")
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name.startswith("ray") else real(name, *a),
    )
    with pytest.raises(ConfigError, match="max_restarts=1.*launch with torchrun"):
        wb.launch(RunConfig(dp=2, max_restarts=1), out=str(out), progress=False, launcher="ray")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(
        ConfigError, match="4 ranks need a CPU each, and this machine has 2 CPU core"
    ):
        wb.launch(RunConfig(dp=4), out=str(out), progress=False, launcher="ray")
    with pytest.raises(ConfigError, match="places the workers on the cluster itself"):
        wb.launch(
            RunConfig(dp=2),
            out=str(out),
            progress=False,
            launcher="ray",
            nodes=Nodes(nnodes=2, rdzv_endpoint="h:1"),
        )
    with pytest.raises(ConfigError, match="launcher='slurm': valid are 'torchrun' and 'ray'"):
        wb.launch(RunConfig(dp=2), out=str(out), progress=False, launcher="slurm")
    assert not out.exists(), "nothing started"


@pytest.mark.slow
def test_dp2_under_ray_equals_dp2_under_torchrun(launched, tmp_path):
    from workbench.trace.validate import validate_run

    run = wb.launch(
        RunConfig(dp=2, steps=6, timeout_s=60),
        out=str(tmp_path / "ray"),
        progress=False,
        launcher="ray",
    )
    torchrun = launched(dp=2)
    assert list(run.metrics.loss) == list(torchrun.metrics.loss), (
        "the same ranks, the same arithmetic"
    )
    assert list(run.metrics.grad_norm) == list(torchrun.metrics.grad_norm)
    assert validate_run(run.path) == []
    assert run.summary["world_size"] == 2 and len(run.summary["ranks"]) == 2


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="lists processes through /proc")
def test_sigterm_leaves_no_ray_process(tmp_path):
    run_dir = str(tmp_path / "long")
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "run",
            "--launcher",
            "ray",
            "--dp",
            "2",
            "--steps",
            "1000",
            "--fault",
            "straggle",
            "--fault-delay-s",
            "0.05",
            "--out",
            run_dir,
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.monotonic() + 120
    while (
        not (os.path.exists(metrics) and os.path.getsize(metrics)) and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    family = _descendants(cli.pid)
    assert len(family) >= 4, "Ray's processes and two workers are running"
    cli.send_signal(signal.SIGTERM)
    out, _ = cli.communicate(timeout=120)
    deadline = time.monotonic() + 30
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _alive(family) == set(), "a Ray process outlived the launcher"
    assert cli.returncode == 130 and "partial results in" in out, out[-3000:]


@pytest.mark.slow
@needs_cluster
def test_ray_across_the_nodes_of_a_cluster_equals_torchrun(launched, tmp_path):
    """A Ray head in node 0's namespace, a Ray worker node in node 1's, the driver inside node 0
    (launching/ray_cluster.py): one rank on each node, across the 1 Gbit/s link — the same losses as dp = 2 under
    torchrun on one machine, exactly (the same ranks, the same arithmetic, another wire), and nothing of Ray left
    in the nodes or in /tmp/ray's pointer to the current cluster."""
    import glob
    import tempfile

    from workbench.launching import local_cluster as lc

    with lc.LocalCluster(name="cray", nodes=2, ranks_per_node=1, rate_mbit=1000) as c:
        run = wb.launch(
            RunConfig(dp=2, steps=6, timeout_s=60),
            out=str(tmp_path / "ray"),
            progress=False,
            launcher="ray",
            cluster=c,
        )
        left = lc.status("cray")["namespaces"]
        assert set(left.values()) == {0}, f"Ray's processes outlived the run: {left}"
        assert not glob.glob(os.path.join(tempfile.gettempdir(), "wb-ray-cray-*")), "Ray's files"
    # Ray places rank 0 on either node
    assert sorted(run.config["hosts"]) == ["wb-cray-n0", "wb-cray-n1"], "one rank in each node"
    torchrun = launched(dp=2, steps=6, timeout_s=60)
    assert list(run.metrics.loss) == list(torchrun.metrics.loss)
    with open(os.path.join(run.path, "launcher.log")) as f:
        log = f.read()
    assert "ray start" in log and "--head" in log and "--address 198.18.0.1:6379" in log, log[
        -2000:
    ]


def test_ray_on_a_cluster_must_fill_it(tmp_path):
    from workbench.launching.local_cluster import LocalCluster
    from workbench.launching.ray_cluster import check_ray_on_cluster

    c = LocalCluster(name="craychk", nodes=2, ranks_per_node=2)
    with pytest.raises(ConfigError, match=r"3 ranks .* 2 nodes × 2 ranks = 4"):
        check_ray_on_cluster(
            RunConfig(dp=3, global_batch=6).validate(), c, nnodes=1, ray_address=None
        )
    with pytest.raises(ConfigError, match="starts Ray on its nodes itself"):
        check_ray_on_cluster(RunConfig(dp=4).validate(), c, nnodes=1, ray_address="h:1")
