"""Slurm for real (launching/local_slurm.py): munge, slurmctld and a slurmd in each node of a local cluster; the
sbatch script `workbench slurm-script` writes (launching/slurm_script.py) is submitted with sbatch and runs srun
+ torchrun across 2 nodes of 2 ranks. The job's run directory is a run like any other (wb.load reads it, the
run format check passes, each rank's node is recorded), and it trained what one process trains.

The correctness oracle's tolerance is that of tests/test_local_cluster.py, for the same reason: dp = 4 across
the two nodes sums the same fp32 gradients as dp = 4 on one machine (4 partial sums where one process sums the
whole batch), and Slurm only decides where the same command runs; against one process, the 1e-5 relative of
tests/test_data_parallel.py holds (measured: 1.2e-7 at most, an fp32 rounding, the same in three jobs).

Marked `slurm`: `make test-slurm` runs them, after installing Debian's slurmctld, slurmd, slurm-client and
munge where it is root with apt (`make test` does not: the job takes ~10 s, but the daemons must be
installed). Each case skips, saying why, without root or without Slurm's programs. Measured here (2 cores,
shared with other helpers' runs, load ~3): the daemons idle within 0.03–1.1 s of the start, the job completes
10.0–10.7 s after sbatch (six runs), the teardown takes 1.3–1.9 s."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.launching import local_cluster as lc
from workbench.launching import local_slurm
from workbench.launching.local_slurm import LocalSlurm
from workbench.launching.slurm_script import SlurmJob, slurm_script
from workbench.trace.validate import validate_run

MISSING = [p for p in (*local_slurm.PROGRAMS, "ip", "tc") if shutil.which(p) is None]
WHY_NOT = (
    "a local Slurm needs root (network namespaces)"
    if os.geteuid() != 0
    else f"{', '.join(MISSING)} missing here: a local Slurm needs Slurm's and munge's programs and iproute2 "
    f"(make test-slurm installs slurmctld, slurmd, slurm-client and munge with apt-get)"
    if MISSING
    else ""
)
needs_slurm = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
#: a job's longest wait: it takes ~10 s here; a loaded machine gets room, a hang does not get minutes
JOB_TIMEOUT_S = 120


def test_refused_without_slurm(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda p: None if p in ("slurmd", "munged") else "/bin/x")
    with pytest.raises(ConfigError, match="needs munged, slurmd on PATH .*apt-get install"):
        local_slurm.require_slurm()


def _losses(run: wb.Run) -> list[float]:
    return run.metrics.sort_values("step")["loss"].tolist()


@pytest.mark.slurm
@needs_slurm
def test_a_slurm_job_across_two_nodes_trains_what_one_process_trains(tmp_path):
    base = {"steps": 6, "global_batch": 8, "seed": 0, "timeout_s": 60}
    one = wb.launch(RunConfig(**base), out=str(tmp_path / "one"), progress=False)
    config = RunConfig(**base, dp=4).validate()
    job = SlurmJob(
        nodes=2,
        time="5",
        out=str(tmp_path / "job"),
        command=f"{shlex.quote(sys.executable)} -m workbench.cli",
    )
    script = tmp_path / "job.sbatch"
    script.write_text(slurm_script(config, job))
    with lc.LocalCluster(name="bslurm", nodes=2, ranks_per_node=2, rate_mbit=1000) as c:
        with LocalSlurm(cluster=c) as slurm:
            job_id = slurm.submit(str(script), workdir=str(tmp_path))
            state = slurm.wait(job_id, timeout_s=JOB_TIMEOUT_S)
            output = (tmp_path / f"slurm-{job_id}.out").read_text()
            assert state == "COMPLETED", f"job {job_id} {state}:\n{output[-3000:]}"
    run = wb.load(str(tmp_path / "job" / "node0"))
    assert validate_run(run.path) == []
    assert _losses(run) == pytest.approx(_losses(one), rel=1e-5)
    assert run.config["hosts"] == ["wb-bslurm-n0"] * 2 + ["wb-bslurm-n1"] * 2, (
        "Slurm's nodes are the namespaces: the first two ranks on the first node"
    )
    assert sorted(p.name for p in (tmp_path / "job" / "node1").glob("trace_rank*.json")) == [
        "trace_rank2.json",
        "trace_rank3.json",
    ], "the second node wrote its own ranks' traces in its own directory"


@pytest.mark.slurm
@needs_slurm
def test_down_cancels_the_jobs_and_stops_every_daemon(tmp_path):
    script = tmp_path / "sleep.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun sleep 600\n"
    )
    with lc.LocalCluster(name="bdown", nodes=2, ranks_per_node=1, rate_mbit=None) as c:
        slurm = LocalSlurm(cluster=c).up()
        job_id = slurm.submit(str(script), workdir=str(tmp_path))
        deadline = time.monotonic() + 30
        while slurm.state(job_id) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert slurm.state(job_id) == "RUNNING"
        assert _pids(c.namespace(1)), "the second node runs its slurmd and the job's task"
        slurm.down()
        left = {c.namespace(k): _pids(c.namespace(k)) for k in range(c.nodes)}
        assert left == {c.namespace(0): [], c.namespace(1): []}, (
            f"processes left in the nodes: {left}"
        )
        assert not os.path.exists(slurm.folder)
    assert "bdown" not in lc.clusters()


def _pids(namespace: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]
