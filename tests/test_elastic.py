"""Elastic membership (torchrun --nnodes MIN:MAX, two agents on this machine as two "machines"): the run
goes on when one machine leaves and again when it rejoins, dp following the world each time, and ends
with the losses of the uninterrupted run."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.distributed import metrics_rows
from workbench import ConfigError, RunConfig, load
from workbench.launching.launcher import Nodes, elastic_config, rank_env, torchrun_command

STEPS = 30
#: rank 0 sleeps this long in every step ("straggle"), so that the one-machine phase lasts long enough
#: for the second machine to come back (its agent and rank take ~5 s to start and join)
DELAY_S = 0.2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(run_dir: str, endpoint: str) -> subprocess.Popen:
    """One machine's agent: `workbench run` with the same request as the other."""
    cmd = [
        sys.executable,
        "-m",
        "workbench.cli",
        "run",
        "--model",
        "tiny",
        "--dp",
        "2",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        "2",
        "--max-restarts",
        "3",
        "--timeout",
        "30",
        "--fault",
        "straggle",
        "--fault-delay-s",
        str(DELAY_S),
        "--nnodes",
        "1:2",
        "--rdzv-endpoint",
        endpoint,
        "--out",
        run_dir,
        "--quiet",
    ]
    return subprocess.Popen(
        cmd, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _lose_machine(agent: subprocess.Popen) -> None:
    """SIGKILL a machine's agent and its ranks, the way a machine that loses power goes: nothing runs after."""
    torchrun = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == agent.pid]
    ranks = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) in torchrun]
    for pid in [agent.pid, *torchrun, *ranks]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait()


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _wait_for(what: str, predicate, agents: list[subprocess.Popen], timeout_s: float = 60) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end or any(a.poll() is not None for a in agents):
            for a in agents:
                a.kill()
            logs = " | ".join((a.communicate()[0] or "")[-1500:] for a in agents)
            raise AssertionError(f"waited for {what}: {logs}")
        time.sleep(0.1)


@pytest.mark.slow  # notebook 08 runs 2 → 1 → 2 machines, checked against an uninterrupted run, in make test
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the agent's ranks through /proc")
def test_an_elastic_run_goes_on_when_a_machine_leaves_and_rejoins(launched, tmp_path):
    run_dir, endpoint = str(tmp_path / "elastic"), f"127.0.0.1:{_free_port()}"
    a = _agent(run_dir, endpoint)
    _wait_for("the request", lambda: os.path.exists(os.path.join(run_dir, "request.json")), [a])
    b = _agent(run_dir, endpoint)
    _wait_for(
        "steps on two machines",
        lambda: any(r["world_size"] == 2 and r["step"] >= 4 for r in metrics_rows(run_dir)),
        [a, b],
    )
    _lose_machine(b)
    _wait_for(
        "the run to go on with one machine",
        lambda: any(r["world_size"] == 1 for r in metrics_rows(run_dir)),
        [a],
    )
    b = _agent(run_dir, endpoint)
    for agent in (a, b):
        out, _ = agent.communicate(timeout=180)
        assert agent.returncode == 0, out[-3000:]

    run = load(run_dir)
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(STEPS)), (
        "every step once (redone steps replace the lost ones)"
    )
    worlds = [r["world_size"] for r in rows]
    changes = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
    assert changes == [2, 1, 2], f"two machines, then one, then two again: {worlds}"
    assert len(os.listdir(os.path.join(run_dir, "attempts"))) >= 2 and os.path.exists(
        os.path.join(run_dir, "trace_all_attempts.json")
    ), "every group's traces are kept, on one timeline"
    # The same global batch each step, split over whatever dp the group has; resharded resumes: the
    # losses match the uninterrupted run within fp32's reordered sums (as resharding does, 1e-5 relative).
    whole = launched(dp=2, steps=STEPS)  # the same run test_onebit_adam.py compares with
    for got, want in zip(run.metrics.loss, whole.metrics.loss, strict=True):
        assert abs(got - want) <= 1e-5 * abs(want), (got, want)


def test_elastic_ranges_are_checked_before_launch():
    base = RunConfig(dp=4, global_batch=8, checkpoint_every=2, max_restarts=1).validate()
    with pytest.raises(ConfigError, match=r"with 3 machine\(s\) \(dp=3\)"):
        elastic_config(base, Nodes(nnodes="2:4", rdzv_endpoint="h:1"))
    with pytest.raises(ConfigError, match="needs checkpoint_every"):
        elastic_config(
            base.replace(checkpoint_every=0).validate(), Nodes(nnodes="1:2", rdzv_endpoint="h:1")
        )
    with pytest.raises(ConfigError, match="nnodes='2:1'"):
        torchrun_command(base, "run", Nodes(nnodes="2:1", rdzv_endpoint="h:1"))
    cmd = torchrun_command(
        elastic_config(base, Nodes(nnodes="1:2", rdzv_endpoint="h:1")),
        "run",
        Nodes(nnodes="1:2", rdzv_endpoint="h:1"),
    )
    assert cmd[cmd.index("--nnodes") + 1] == "1:2" and cmd[cmd.index("--nproc-per-node") + 1] == "2"
