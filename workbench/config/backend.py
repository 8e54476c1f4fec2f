"""Which torch.distributed backend a launch runs on, decided before any process starts (the launcher) and
again on a rank started by hand (Slurm, Kubernetes: engine/context.py) — the same rule in both places.

    gloo   the CPU, as asked
    nccl   where every rank of a machine has a GPU of its own; refused before launch, naming both counts,
           where fewer (an NCCL rank without a GPU fails later with "invalid device ordinal")
    auto   NCCL where every rank has a GPU of its own, else gloo on the CPU — saying so in one line where
           the machine has GPUs, too few of them (`auto_fallback`)
    mpi, ccl  builds of torch and bindings that few machines have: refused, naming what is missing

No torch at import (torch.distributed is asked about MPI only when mpi is requested).
"""

from __future__ import annotations

import os

from workbench.config.model_config import ConfigError

#: set by a test suite (or a user) to run every `backend='auto'` launch on one backend: `make test` is the CPU
#: suite and sets gloo, so that it runs the same on a machine with GPUs
BACKEND_ENV = "WORKBENCH_BACKEND"
#: the backend the launcher chose, handed to the ranks (engine/context.py)
RESOLVED_BACKEND = "WORKBENCH_RESOLVED_BACKEND"


def backend_for(requested: str, ranks_per_machine: int, gpus: int) -> str:
    """The backend a launch runs on: 'gloo' as asked; 'nccl' as asked where every rank of a machine has a
    GPU of its own; 'auto' → NCCL where every rank has a GPU of its own, else gloo on the CPU (a notebook's
    4-rank cell on a 1-GPU machine runs, on the CPU: `auto_fallback` says so). An explicit 'nccl' without
    a GPU per rank is a ConfigError naming both counts — before any process starts (an NCCL rank without a
    GPU of its own fails later with "invalid device ordinal")."""
    if requested == "auto" and os.environ.get(BACKEND_ENV) in ("gloo", "nccl"):
        requested = os.environ[BACKEND_ENV]
    if requested in ("mpi", "ccl"):
        check_backend_installed(requested)
        return requested
    if requested == "gloo" or (requested == "auto" and (gpus == 0 or ranks_per_machine > gpus)):
        return "gloo"
    if gpus == 0:
        raise ConfigError(
            "backend='nccl' needs CUDA GPUs, and none is visible here (torch.cuda.device_count() = 0): "
            "run on the CPU with --backend gloo (backend='gloo'), or 'auto'"
        )
    if ranks_per_machine > gpus:
        raise ConfigError(
            f"backend={requested!r}: {ranks_per_machine} ranks per machine, but {gpus} GPU(s) visible "
            f"(CUDA_VISIBLE_DEVICES); NCCL needs one GPU per rank. Run on the CPU with --backend gloo "
            f"(backend='gloo'), or use at most {gpus} rank(s) per machine"
        )
    return "nccl"


def auto_fallback(requested: str, ranks_per_machine: int, gpus: int) -> str | None:
    """The one line a launch prints where 'auto' chose the CPU on a machine that has GPUs (too few of them for
    one a rank); None otherwise."""
    if requested != "auto" or os.environ.get(BACKEND_ENV) or gpus == 0 or ranks_per_machine <= gpus:
        return None
    return (
        f"[workbench] backend auto: {ranks_per_machine} ranks per machine and {gpus} GPU(s) — NCCL needs one "
        f"GPU a rank, so this run goes on the CPU with gloo (ask for backend='nccl' to refuse instead)"
    )


def check_backend_installed(backend: str) -> None:
    """mpi and ccl exist only in some builds: a ConfigError naming what is missing and the fix, before launch.

    mpi: torch's MPI backend is compiled into torch (PyPI's wheels have none) and takes its ranks from
    `mpirun`, not torchrun — workbench launches with torchrun, so even a torch built with MPI is refused,
    with that reason. ccl: Intel's oneCCL bindings (`oneccl_bindings_for_pytorch`, pip package
    oneccl_bind_pt) register the backend when imported; the ranks import them (engine/context.py)."""
    if backend == "mpi":
        import torch.distributed as dist

        if not dist.is_mpi_available():
            raise ConfigError(
                "backend='mpi': this torch was built without MPI (PyPI's wheels are); build torch from "
                "source against an MPI library, or use backend='gloo' (CPUs) or 'nccl' (GPUs)"
            )
        raise ConfigError(
            "backend='mpi': torch's MPI backend takes its ranks from mpirun, and workbench launches "
            "with torchrun; use backend='gloo' (CPUs) or 'nccl' (GPUs)"
        )
    import importlib.util

    if importlib.util.find_spec("oneccl_bindings_for_pytorch") is None:
        raise ConfigError(
            "backend='ccl': Intel's oneCCL bindings are not installed (module "
            "oneccl_bindings_for_pytorch): pip install oneccl_bind_pt (the build matching your torch, "
            "from Intel's index), or use backend='gloo' (CPUs) or 'nccl' (GPUs)"
        )
