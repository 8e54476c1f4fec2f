"""A cluster on this machine (launching/local_cluster.py): nodes as network namespaces joined by tbf-shaped
links, one torchrun agent per node (launching/cluster_launch.py). 2 nodes × 2 ranks train what one process
trains — dp, and dp × tp with each tp group inside a node — and nothing is left behind.

The correctness oracle's tolerance is test_data_parallel.py's, 1e-5 relative: dp over 4 ranks adds 4 partial
sums of the fp32 gradients where one process sums the whole batch, so the losses may differ by rounding; a
cluster only moves the same bytes over another wire.

The cluster cases need a local cluster here, as root (tests/cluster_skip.py): elsewhere they skip, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import workbench as wb
from tests.cluster_skip import needs_cluster
from workbench import ConfigError, RunConfig
from workbench.launching import local_cluster as lc
from workbench.launching import namespace_host


def test_refused_without_root_or_user_namespaces(monkeypatch):
    monkeypatch.setattr(namespace_host.shutil, "which", lambda program: f"/usr/bin/{program}")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(namespace_host, "_userns_works", lambda: False)
    with pytest.raises(ConfigError, match="needs root .*uid 1000 .*unshare -rn true` fails"):
        lc.LocalCluster(name="nonroot").up()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "Bad-Name"}, "lowercase letters or digits"),
        ({"nodes": 0}, "1 to 250 nodes"),
        ({"ranks_per_node": 0}, "at least 1"),
        ({"rate_mbit": -5}, "Mbit/s"),
    ],
)
def test_bad_shapes_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        lc.LocalCluster(**kwargs)


@needs_cluster
def test_run_must_fit_the_cluster(tmp_path):
    with lc.LocalCluster(name="tfit", nodes=2, ranks_per_node=2) as c:
        with pytest.raises(ConfigError, match=r"3 ranks .* 2 nodes × 2 ranks = 4"):
            wb.launch(RunConfig(dp=3, global_batch=6), out=str(tmp_path / "r"), cluster=c)
        with pytest.raises(ConfigError, match="is not up"):
            wb.launch(RunConfig(dp=4), out=str(tmp_path / "r2"), cluster="nosuch")


@needs_cluster
def test_a_cluster_another_live_process_brought_up_is_not_taken_over():
    script = (
        "import time; from workbench.launching import local_cluster as lc; "
        "lc.LocalCluster(name='towned', nodes=1).up(); print('up', flush=True); time.sleep(600)"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        with pytest.raises(
            ConfigError, match=f"brought up by process {owner.pid}, which still runs"
        ):
            lc.LocalCluster(name="towned", nodes=1).up()
        assert "towned" in lc.clusters()
    finally:
        owner.kill()
        owner.wait()
        lc.down("towned")


@needs_cluster
def test_up_and_down_leave_nothing():
    before = set(namespace_host.NamespaceHost().namespaces())
    c = lc.LocalCluster(name="tupdown", nodes=3, ranks_per_node=1, rate_mbit=200).up()
    assert lc.status("tupdown")["namespaces"].keys() == {
        "wb-tupdown-n0",
        "wb-tupdown-n1",
        "wb-tupdown-n2",
        "wb-tupdown-sw",
    }
    qdisc = subprocess.run(
        c.exec_argv(1, ["tc", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True
    ).stdout
    assert "tbf" in qdisc and "200Mbit" in qdisc, qdisc
    # a process left running in a node (a killed run's) is stopped by down
    sleeper = subprocess.Popen(c.exec_argv(2, ["sleep", "600"]))
    lc.down("tupdown")
    assert sleeper.wait(timeout=10) != 0
    assert set(namespace_host.NamespaceHost().namespaces()) == before
    assert "tupdown" not in lc.clusters()
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "tupdown" not in root_links and "br0" not in root_links


def _losses(run: wb.Run) -> list[float]:
    return run.metrics.sort_values("step")["loss"].tolist()


@needs_cluster
@pytest.mark.parametrize("grid", [{"dp": 4}, {"dp": 2, "tp": 2}], ids=["dp4", "dp2xtp2"])
def test_two_nodes_train_what_one_process_trains(tmp_path, grid):
    base = {"steps": 4, "global_batch": 8, "seed": 0, "timeout_s": 60}
    one = wb.launch(RunConfig(**base), out=str(tmp_path / "one"), progress=False)
    with lc.LocalCluster(name="ttrain", nodes=2, ranks_per_node=2, rate_mbit=1000) as c:
        run = wb.launch(
            RunConfig(**base, **grid), out=str(tmp_path / "cluster"), cluster=c, progress=False
        )
    assert _losses(run) == pytest.approx(_losses(one), rel=1e-5)
    # every rank recorded its node; a tp group sits inside one node (torchrun numbers a node's ranks
    # consecutively, and tp is the fastest-varying axis of the grid)
    nodes = run.config["hosts"]
    assert nodes == ["wb-ttrain-n0", "wb-ttrain-n0", "wb-ttrain-n1", "wb-ttrain-n1"]
    assert "ttrain" not in lc.clusters()


USERNS = namespace_host._probe(["unshare", "-rn", "true"])


@pytest.mark.skipif(not USERNS, reason="`unshare -rn true` fails here: no user namespaces")
def test_in_a_user_namespace_and_gone_with_its_owner(tmp_path, monkeypatch):
    """The unprivileged path (launching/namespace_host.py), asked for as root: the namespaces live in a
    holder's user namespace, invisible to the machine's `ip netns list`; a dp run across them trains what one
    process trains; and when the process that brought the cluster up is killed (SIGKILL: no clean-up of its
    own runs), its holder dies with it, and the namespaces with the holder."""
    monkeypatch.setenv("WORKBENCH_CLUSTER_HOST", "userns")
    base = {"steps": 3, "global_batch": 8, "seed": 0, "timeout_s": 60}
    with lc.LocalCluster(name="tuserns", nodes=2, ranks_per_node=1, rate_mbit=500) as c:
        holder = c.host
        assert (
            holder.holder_pid and "wb-tuserns-n0" not in namespace_host.NamespaceHost().namespaces()
        )
        run = wb.launch(RunConfig(dp=2, **base), out=str(tmp_path / "c"), cluster=c, progress=False)
    one = wb.launch(RunConfig(**base), out=str(tmp_path / "one"), progress=False)
    assert _losses(run) == pytest.approx(_losses(one), rel=1e-5)
    assert not holder.alive
    # the owner killed outright
    script = (
        "import os, sys, time; from workbench.launching import local_cluster as lc; "
        "lc.LocalCluster(name='tkilled', nodes=2).up(); "
        "s = lc.status('tkilled'); print(s['holder_pid'], s['holder_start'], flush=True); "
        "time.sleep(600)"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid, start = (int(v) for v in owner.stdout.readline().split())
    holder = namespace_host.NamespaceHost(holder_pid=pid, holder_start=start)
    assert holder.alive
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    while holder.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not holder.alive
    assert "tkilled" not in lc.clusters()
    lc.down("tkilled")  # its state file, left by the killed owner
