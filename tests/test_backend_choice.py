"""Which backend a launch runs on, decided before any process starts. CUDA is faked by monkeypatching
torch.cuda.device_count, so the rule is proven on a machine without GPUs: NCCL only where every rank of a
machine has a GPU of its own; 'auto' with fewer GPUs than ranks goes on the CPU with gloo and says so in one
line (a notebook's 4-rank cell on a 1-GPU machine runs); an explicit 'nccl' there is a ConfigError naming
both counts (and --backend gloo) — where NCCL used to fail inside the ranks with "invalid device ordinal"."""

import os

import pytest
import torch

import workbench as wb
from workbench import ConfigError, RunConfig
from workbench.config.backend import BACKEND_ENV
from workbench.launching.launcher import Nodes, choose_backend


@pytest.fixture
def gpus(monkeypatch):
    """Set how many CUDA devices this process sees; the test suite's gloo override is lifted."""
    monkeypatch.delenv(BACKEND_ENV, raising=False)

    def see(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return see


def test_auto_is_gloo_on_a_machine_without_gpus(gpus):
    gpus(0)
    assert choose_backend(RunConfig(dp=4)) == "gloo"


@pytest.mark.parametrize("dp, visible", [(1, 1), (2, 2), (2, 8), (8, 8)])
def test_auto_is_nccl_when_every_rank_has_a_gpu(gpus, dp, visible):
    gpus(visible)
    assert choose_backend(RunConfig(dp=dp, global_batch=16)) == "nccl"


def test_auto_with_too_few_gpus_runs_on_the_cpu_and_says_so_in_one_line(gpus, capsys):
    """make demo's dp = 2, or a notebook's 4-rank cell, on a one-GPU machine: gloo, and one line naming both
    counts and how to refuse instead."""
    gpus(1)
    assert choose_backend(RunConfig(dp=2), say=True) == "gloo"
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        len(lines) == 1
        and "2 ranks per machine and 1 GPU(s)" in lines[0]
        and "backend='nccl'" in lines[0]
    )
    assert choose_backend(RunConfig(dp=1), say=True) == "nccl" and capsys.readouterr().err == "", (
        "one rank: its GPU"
    )


def test_nccl_with_too_few_gpus_fails_before_any_process_starts(gpus, tmp_path):
    """An explicit nccl on too few GPUs: an error naming both counts and the way out, and no run directory —
    nothing was started."""
    gpus(1)
    out = tmp_path / "demo"
    with pytest.raises(
        ConfigError, match=r"2 ranks per machine, but 1 GPU\(s\) visible.*--backend gloo"
    ):
        wb.launch(RunConfig(dp=2, backend="nccl"), out=str(out), progress=False)
    assert not out.exists()


def test_nccl_asked_for_without_gpus_is_refused(gpus):
    gpus(0)
    with pytest.raises(ConfigError, match="backend='nccl' needs CUDA GPUs.*--backend gloo"):
        choose_backend(RunConfig(backend="nccl"))
    gpus(2)
    with pytest.raises(ConfigError, match=r"4 ranks per machine, but 2 GPU"):
        choose_backend(RunConfig(dp=4, backend="nccl"))


def test_gloo_is_gloo_whatever_the_machine_has(gpus):
    gpus(8)
    assert choose_backend(RunConfig(dp=2, backend="gloo")) == "gloo"


def test_ranks_per_machine_count_across_machines(gpus):
    """dp = 8 over two machines is 4 ranks on each: four GPUs each are enough, three are not."""
    gpus(4)
    nodes = Nodes(nnodes=2, rdzv_endpoint="host:29500")
    assert choose_backend(RunConfig(dp=8, global_batch=16), nodes) == "nccl"
    gpus(3)
    with pytest.raises(ConfigError, match="4 ranks per machine, but 3 GPU"):
        choose_backend(RunConfig(dp=8, global_batch=16, backend="nccl"), nodes)
    assert choose_backend(RunConfig(dp=8, global_batch=16), nodes) == "gloo"


def test_the_cpu_suite_runs_auto_on_gloo_even_beside_gpus(gpus, monkeypatch):
    """make test sets WORKBENCH_BACKEND=gloo (tests/conftest.py): its launches run alike on any machine;
    the GPU suite asks for nccl by name."""
    gpus(8)
    monkeypatch.setenv(BACKEND_ENV, "gloo")
    assert choose_backend(RunConfig(dp=2)) == "gloo"
    assert choose_backend(RunConfig(dp=2, backend="nccl")) == "nccl"
    assert os.environ[BACKEND_ENV] == "gloo"


def test_the_ring_demo_stays_on_the_cpu_unless_asked(gpus):
    """A teaching demo of a few numbers: gloo explicitly, whatever GPUs there are (it once kept 'auto' and
    handed CPU tensors to NCCL)."""
    import inspect

    from workbench.launching.launcher import ring_demo

    assert inspect.signature(ring_demo).parameters["backend"].default == "gloo"
    gpus(8)
    assert choose_backend(RunConfig(dp=4, backend="gloo", global_batch=12)) == "gloo"


def test_mpi_and_ccl_are_refused_with_what_is_missing_before_launch(monkeypatch, tmp_path):
    """PyPI's torch has no MPI, and oneCCL's bindings are a separate install: both are ConfigErrors naming
    the missing piece and the fix (the CLI's exit code 2), with no run directory made. A torch built with MPI
    is refused too, with the reason (its ranks come from mpirun, ours from torchrun)."""
    import importlib.util

    import torch.distributed as dist

    out = tmp_path / "r"
    monkeypatch.setattr(dist, "is_mpi_available", lambda: False)
    with pytest.raises(
        ConfigError, match="backend='mpi': this torch was built without MPI.*backend='gloo'"
    ):
        wb.launch(RunConfig(backend="mpi"), out=str(out), progress=False)
    monkeypatch.setattr(dist, "is_mpi_available", lambda: True)
    with pytest.raises(ConfigError, match="takes its ranks from mpirun"):
        choose_backend(RunConfig(backend="mpi"))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "oneccl_bindings_for_pytorch" else real(name, *a),
    )
    with pytest.raises(
        ConfigError,
        match="backend='ccl': Intel's oneCCL bindings are not installed.*oneccl_bind_pt",
    ):
        wb.launch(RunConfig(backend="ccl"), out=str(out), progress=False)
    assert not out.exists()
    from workbench.cli import main

    assert main(["run", "--backend", "ccl", "--out", str(out), "--quiet"]) == 2
