"""A failing or stuck rank ends the job quickly, says which rank and operation, and keeps the traces."""

import json
import os
import time

import pytest

import workbench as wb
from workbench.trace.validate import validate_trace


def test_a_rank_that_raises_fails_the_launch_with_its_traceback(tmp_path):
    t = time.time()
    with pytest.raises(wb.RunFailed) as e:
        wb.launch(
            wb.RunConfig(dp=2, steps=6, fault="raise", fault_rank=1, fault_step=3, timeout_s=30),
            out=str(tmp_path / "crash"),
            progress=False,
        )
    assert time.time() - t < 60, "fail fast, not after the process-group timeout"
    assert e.value.rank == 1
    assert "injected fault on rank 1 at step 3" in str(e.value)
    assert "Traceback" in e.value.traceback
    run = e.value.run
    assert len(run.metrics) == 3, "the metrics of the steps that finished are kept"
    for r in (0, 1):
        path = os.path.join(run.path, f"trace_rank{r}.json")
        assert os.path.exists(path), f"rank {r}'s trace is kept"
    assert all(validate_trace(t) == [] for t in run.traces)
    assert os.path.exists(os.path.join(run.path, "trace.json"))


def test_a_rank_killed_by_sigkill_is_named_as_the_root_cause(tmp_path):
    """SIGKILL (what the kernel's out-of-memory killer sends) runs no handler: the killed rank writes no error file,
    and its peer's broken collective would otherwise be named. torchrun's summary names the signal."""
    from workbench.analysis.doctor import diagnose

    with pytest.raises(wb.RunFailed) as e:
        wb.launch(
            wb.RunConfig(dp=2, steps=4, fault="kill", fault_rank=1, fault_step=1, timeout_s=30),
            out=str(tmp_path / "killed"),
            progress=False,
        )
    assert e.value.rank == 1
    first = str(e.value).splitlines()[0]
    assert first.startswith("rank 1 ") and "SIGKILL" in first and "out-of-memory killer" in first, (
        first
    )
    assert "rank 0: CommError" in str(e.value), "the peer that failed because of it: named second"
    assert "the first cause: rank 1: Killed" in diagnose(e.value.run.path).splitlines()[0]


def test_the_kernel_s_log_decides_out_of_memory(tmp_path):
    from workbench.analysis.killed_ranks import killed_ranks, oom_killed, torchrun_signals

    log = (
        "  rank      : 3 (local_rank: 1)\n  exitcode  : -9 (pid: 4242)  (SIGKILL)\n"
        "  rank      : 2 (local_rank: 0)\n  exitcode  : 1 (pid: 4241)\n"
    )
    assert torchrun_signals(log) == {3: (9, 4242)}
    for rank, reserved, error_file in ((3, True, False), (2, True, True), (1, False, False)):
        if reserved:
            (tmp_path / f".error_rank{rank}.reserved").write_bytes(b"\0" * 16)
        if error_file:
            (tmp_path / f"error_rank{rank}.json").write_text("{}")
    (tmp_path / ".error_rank7.reserved").write_bytes(b"\0")  # a rank an earlier, larger attempt had
    # rank 2 wrote its file; 1 ended well
    [killed] = killed_ranks(str(tmp_path), log, 4, read_kernel_log=False)
    assert (killed.rank, killed.signal, killed.pid) == (3, 9, 4242)
    # what the kernel's log says in "Out of memory: Killed process 4242 (python) ..."
    killed.out_of_memory = True
    assert "out-of-memory killer ended it" in killed.describe()
    assert oom_killed("[12.3] Out of memory: Killed process 4242 (python) total-vm:1kB", 4242)
    assert oom_killed("[12.3] oom-kill:constraint=CONSTRAINT_NONE,task=python,pid=4242,uid=0", 4242)
    assert not oom_killed("[ 4242.000001] Out of memory: Killed process 4243 (python)", 4242), (
        "not its timestamp"
    )


@pytest.mark.slow  # notebook 08's hang checks the same in make test: the error, doctor's and torch's views
def test_a_stuck_rank_times_out_naming_the_operation(tmp_path):
    t = time.time()
    with pytest.raises(wb.RunFailed) as e:
        wb.launch(
            wb.RunConfig(dp=2, steps=4, fault="hang", fault_rank=1, fault_step=1, timeout_s=5),
            out=str(tmp_path / "hang"),
            progress=False,
        )
    assert time.time() - t < 60
    msg = str(e.value)
    assert e.value.rank == 0 and "all_reduce" in msg and "group dp" in msg
    assert len(e.value.run.metrics) == 1
    # the flight recorder's view: rank 0 is blocked in step 1's first dp collective, rank 1 never started it
    from workbench.analysis.doctor import behind, diagnose

    report = diagnose(e.value.run.path)
    stuck = behind(
        {r: json.load(open(os.path.join(e.value.run.path, f"error_rank{r}.json"))) for r in (0, 1)}
    )
    dp = [g for g in stuck if g["group"] == "dp"]
    assert dp and dp[0]["behind"] == [1], report
    assert dp[0]["newest"][0]["step"] == 1 and dp[0]["newest"][0]["state"] == "started"
    assert dp[0]["newest"][1]["step"] == 0 and dp[0]["newest"][1]["state"] == "done"
    assert "behind: rank 1" in report and "inject_fault" in report, report
    # torch's own flight recorder, dumped by both ranks, says the same
    from workbench.comm.torch_flight_recorder import behind as torch_behind
    from workbench.comm.torch_flight_recorder import read_dumps

    dumps = read_dumps(e.value.run.path)
    assert sorted(dumps) == [0, 1]
    dp_torch = [g for g in torch_behind(dumps) if g["group"] == "dp [0, 1]"]
    assert dp_torch and dp_torch[0]["behind"] == [1], report
    assert (
        "torch's flight recorder (2 dump(s)" in report
        and "group dp [0, 1]: blocked at seq" in report
    ), report


def test_a_fault_wraps_the_step_only_on_its_rank_and_attempt():
    """Injection is a decorator, asked only where the fault strikes: no other rank, and no restarted
    attempt of a kill, has any fault code in its step; the decorated forward and backward run the real
    one at the faulted loss scale."""
    import torch

    from workbench.engine.faults import Fault, FaultyForwardBackward

    kill = wb.RunConfig(dp=2, fault="kill", fault_rank=1, fault_step=3)
    assert Fault.asked(wb.RunConfig(dp=2), rank=1, attempt=0) is None
    assert Fault.asked(kill, rank=0, attempt=0) is None
    assert Fault.asked(kill, rank=1, attempt=1) is None
    asked = Fault.asked(kill, rank=1, attempt=0)
    assert asked is not None and (asked.kind, asked.step) == ("kill", 3)

    class Recorded:
        def __init__(self) -> None:
            self.scales: list[float] = []

        def run(self, x, y, step, loss_scale=1.0):
            self.scales.append(loss_scale)
            return torch.tensor(2.0)

        def evaluate(self, x, y, step):
            return torch.tensor(2.0)

    spike = Fault.asked(
        wb.RunConfig(dp=2, fault="loss-spike", fault_rank=1, fault_step=1), rank=1, attempt=0
    )
    assert spike is not None
    inner = Recorded()
    faulty = FaultyForwardBackward(inner, fault=spike, params=[], moe=None, microbatches=1)
    losses = [float(faulty.run(torch.zeros(1), torch.zeros(1), step, 1.0)) for step in range(3)]
    assert inner.scales == [1.0, 10.0, 1.0] and losses == [2.0, 20.0, 2.0]
