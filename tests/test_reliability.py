"""Nothing silently wrong, nothing lost without a word (issue 37): a run that cannot recover stops, naming the
first bad step and why; metrics.jsonl is strict JSON; a full disk ends a run with one message naming the file
and what was not written, its error files kept; a run that would not fit is refused before launch; a live
run's directory is locked, --force or not. (Checksummed checkpoints: tests/test_checkpoint.py; bad values:
tests/test_config.py and tests/test_config_fuzz.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.analysis.doctor import diagnose
from workbench.engine.anomaly import Divergence, TrainingStopped
from workbench.launching.launcher import RunFailed


def strict(line: str) -> dict:
    """json.loads refusing NaN and Infinity, as jq and JavaScript do."""
    return json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"bare {c}")))


def test_a_run_whose_parameters_turn_non_finite_stops_naming_the_step(tmp_path):
    """Rank 1's parameters become NaN before step 2 (fault 'nan-params'): the all-reduced gradients are NaN on
    every rank, the step is skipped, the parameters are found not finite — the run stops there on both ranks,
    its files kept, doctor naming the cause; metrics.jsonl holds the NaN loss as null."""
    out = tmp_path / "nan"
    with pytest.raises(
        RunFailed, match=r"TrainingStopped: step 2: the parameters are no longer finite"
    ):
        wb.launch(
            RunConfig(dp=2, steps=8, fault="nan-params", fault_rank=1, fault_step=2, timeout_s=30),
            out=str(out),
            progress=False,
        )
    rows = [strict(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2], "the steps before it, and the bad one"
    assert (
        rows[2]["loss"] is None and rows[2]["nonfinite"] == {"loss": "nan"} and rows[2]["skipped"]
    )
    assert "step 2: the parameters are no longer finite" in diagnose(str(out))
    assert (out / "trace_rank0.json").exists() and (out / "error_rank1.json").exists()


def test_k_skipped_steps_in_a_row_stop_a_run_and_fp16s_scaling_does_not():
    d = Divergence(max_skipped=3, lr=3e-3)
    bad = {"skipped": True, "anomaly": "non-finite gradient norm"}
    d.observe(4, 2.0, bad, True)
    # a good step: the count starts again
    d.observe(5, 2.0, {"skipped": False, "anomaly": None}, None)
    for step in (6, 7):
        d.observe(step, float("nan"), bad, True)
    with pytest.raises(
        TrainingStopped, match=r"3 steps skipped in a row, from step 6: the loss was nan"
    ):
        d.observe(8, float("nan"), bad, True)
    fp16 = Divergence(max_skipped=3, lr=1.0)
    for step in range(10):  # overflows are loss scaling at work, however many
        fp16.observe(
            step, 2.0, {"skipped": True, "anomaly": None, "loss_scale": 2.0 ** (15 - step)}, None
        )
    with pytest.raises(TrainingStopped, match="loss scale fell to 0.5"):
        fp16.observe(16, 2.0, {"skipped": True, "anomaly": None, "loss_scale": 0.5}, None)
    never = Divergence(max_skipped=0, lr=1.0)
    for step in range(20):
        never.observe(step, 2.0, bad, True)


SITECUSTOMIZE = """
import builtins, errno, io, os, shutil
_root, _budget, _written = os.environ["WB_FULL_ROOT"], int(os.environ["WB_FULL_BYTES"]), [0]
_open, _usage = io.open, shutil.disk_usage
class _Counted:
    def __init__(self, f): self._f = f
    def write(self, data):
        _written[0] += len(data)
        if _written[0] > _budget:
            _open(_root + ".full", "w").close()  # full for every process from now on
            raise OSError(errno.ENOSPC, "No space left on device")
        return self._f.write(data)
    def __getattr__(self, name): return getattr(self._f, name)
    def __enter__(self): return self
    def __exit__(self, *a): return self._f.__exit__(*a)
def _patched(file, mode="r", *a, **k):
    f = _open(file, mode, *a, **k)
    return _Counted(f) if isinstance(file, (str, os.PathLike)) and str(file).startswith(_root) and \\
        any(m in mode for m in "wax") else f
def _full_usage(path):
    u = _usage(path)
    return u._replace(free=0) if str(path).startswith(_root) and os.path.exists(_root + ".full") else u
builtins.open = io.open = _patched
shutil.disk_usage = _full_usage
"""


@contextlib.contextmanager
def a_small_filesystem(size_kb: int, monkeypatch):
    """A directory whose filesystem fills after `size_kb`: a tmpfs where this test may mount one, else writes
    under it counted in every rank (a sitecustomize) until they fail with ENOSPC."""
    d = tempfile.mkdtemp()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", d], capture_output=True
    ).returncode:
        site = tempfile.mkdtemp()
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(textwrap.dedent(SITECUSTOMIZE))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setenv("WB_FULL_ROOT", d)
        monkeypatch.setenv("WB_FULL_BYTES", str(size_kb * 1024))
        yield d
        return
    try:
        yield d
    finally:
        subprocess.run(["umount", d])


def test_a_full_disk_gives_one_message_and_keeps_the_error_files(monkeypatch):
    with a_small_filesystem(1200, monkeypatch) as d:
        out = os.path.join(d, "run")
        with pytest.raises(RunFailed) as failed:
            wb.launch(
                RunConfig(dp=2, steps=40, checkpoint_every=2, timeout_s=30),
                out=out,
                progress=False,
                check_disk=False,
            )
        first = str(failed.value).splitlines()[0]
        assert (
            "DiskFull" in first
            and "no space left on the device holding" in first
            and "was not written" in first
        )
        for rank in (0, 1):
            with open(os.path.join(out, f"error_rank{rank}.json")) as f:
                assert json.load(f)["type"] == "DiskFull", "each rank's error file, whole"
        partial = [
            n for n in os.listdir(os.path.join(out, "checkpoints")) if n.endswith(".partial")
        ]
        assert partial, "the checkpoint that did not fit stays .partial: never resumed from"
        assert "DiskFull" in diagnose(out)


def test_a_run_that_would_not_fit_is_refused_before_launch(tmp_path, monkeypatch):
    import workbench.launching.disk_space as disk_space

    usage = disk_space.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda p: usage._replace(free=10 * 2**20))
    out = tmp_path / "big"
    with pytest.raises(
        ConfigError, match=r"would write about [\d,.]+ MiB \(checkpoints [\d,.]+ MiB.*10.0 MiB free"
    ):
        wb.launch(
            RunConfig(model="small", dp=2, steps=6, checkpoint_every=2),
            out=str(out),
            progress=False,
        )
    assert not out.exists(), "nothing was started"


def test_a_live_runs_directory_is_locked_against_force_and_a_dead_ones_is_taken_over(
    tmp_path, capsys
):
    # a run alive for ~3 s that leaves the cores to this test: it sleeps in each step
    out = tmp_path / "live"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.cli",
            "run",
            "--steps",
            "6",
            "--fault",
            "straggle",
            "--fault-step",
            "0",
            "--fault-delay-s",
            "0.5",
            "--out",
            str(out),
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = tmp_path / ".live.lock"
        deadline = time.time() + 30
        while not lock.exists() and time.time() < deadline:
            time.sleep(0.1)
        for force in (False, True):
            with pytest.raises(
                ConfigError, match=rf"being written by a live run: PID {first.pid} on this host"
            ):
                wb.launch(RunConfig(steps=2), out=str(out), force=force, progress=False)
    finally:
        assert first.wait(timeout=120) == 0, "the first run was not disturbed"
    assert not lock.exists(), "released at the end"
    lock.write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename, "started": 0}))
    run = wb.launch(RunConfig(steps=2), out=str(out), force=True, progress=False)
    assert (
        len(run.metrics) == 2
        and "taking over the lock of a run that is gone" in capsys.readouterr().err
    )
