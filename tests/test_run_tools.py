"""The tools a run plugs into besides torchrun (issue 28): Nsight Systems around each rank, refused with
the reason where it cannot run; GPU health through NVML, its logic driven by a stand-in NVML module."""

import shutil

import pytest

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.torchrun_command import NSYS_PROFILE, torchrun_command


def test_nsys_wraps_each_rank_and_names_its_report(monkeypatch):
    cmd = torchrun_command(RunConfig(dp=2, nsys=True), "/runs/r")
    i = cmd.index("--no-python")  # torchrun runs nsys, nsys runs the rank
    assert cmd[i + 1:i + 1 + len(NSYS_PROFILE)] == NSYS_PROFILE
    assert "cuda,nvtx,osrt" in cmd and "/runs/r/nsys/rank%q{RANK}" in cmd, "one report per rank, by its RANK"
    assert cmd[-5:] == ["-u", "-m", "workbench.engine.worker", "--run-dir", "/runs/r"]
    assert "--no-python" not in torchrun_command(RunConfig(dp=2), "/runs/r")


def test_nsys_without_nsys_or_without_cuda_fails_before_launch(monkeypatch, tmp_path):
    out = tmp_path / "r"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="`nsys` is not on PATH.*Nsight Systems"):
        wb.launch(RunConfig(nsys=True, backend="gloo"), out=str(out), progress=False)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(ConfigError, match="profiles CUDA ranks, and this run's backend is 'gloo'"):
        wb.launch(RunConfig(nsys=True, backend="gloo"), out=str(out), progress=False)
    assert not out.exists(), "nothing started"
