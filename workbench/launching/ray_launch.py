"""`launch(..., launcher="ray")` / `workbench run --launcher ray [--ray-address ADDR]`: the ranks as Ray Train
workers instead of torchrun's.

Ray Train's `TorchTrainer` starts one worker per rank (a CPU each on gloo, a GPU each on NCCL), sets the
variables torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR ...) and joins the process group with
the run's backend and timeout; each worker then runs the same rank entry point as under torchrun
(launching/worker.py), which finds the group joined and writes the same run directory: traces, metrics,
summary. With no address Ray starts a local cluster for the run and shuts it down after; with one, it
joins that cluster (`ray start --head` on one machine, `ray start --address=...` on the others). Ctrl-C
or SIGTERM stop the workers (the local cluster is shut down with them).

What torchrun does and Ray's launch does not: restarts (`max_restarts`), elastic membership and
`--nnodes` (Ray places the workers itself), and `--nsys`. Ray is optional (`pip install workbench[ray]`);
without it, or with fewer CPUs or GPUs than ranks, the launch fails before anything starts, saying how to
fix it.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from workbench.config import ConfigError, RunConfig, ValidConfig


def check_ray(config: RunConfig, backend: str, address: str | None) -> None:
    """ConfigErrors before anything starts: Ray missing, an option only torchrun has, too few devices here."""
    import importlib.util

    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.train") is None:
        raise ConfigError(
            "launcher='ray': Ray Train is not installed here; pip install 'ray[train]' (or "
            "`pip install workbench[ray]`), or launch with torchrun (the default)"
        )
    for name, value, ok in (("max_restarts", config.max_restarts, 0), ("nsys", config.nsys, False)):
        if value != ok:
            raise ConfigError(
                f"launcher='ray' with {name}={value!r}: that is torchrun's (restarts, Nsight "
                f"Systems around each rank); leave it at {ok!r} or launch with torchrun"
            )
    if address is None:  # a local cluster: this machine must hold a worker per rank
        have = (os.cpu_count() or 1) if backend != "nccl" else _gpus()
        kind = "GPU(s)" if backend == "nccl" else "CPU core(s)"
        if have < config.world_size:
            raise ConfigError(
                f"launcher='ray': {config.world_size} ranks need a {kind[:3]} each, and this machine "
                f"has {have} {kind}; use fewer ranks, or --ray-address of a cluster that has them"
            )


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def rank_main(loop_config: dict[str, Any]) -> None:
    """One Ray Train worker: the rank entry point torchrun would run, on the group Ray joined."""
    from workbench.launching.worker import main

    if main(["--run-dir", loop_config["run_dir"]]) != 0:
        raise RuntimeError(
            f"rank {os.environ.get('RANK')} failed: see its error file in {loop_config['run_dir']}"
        )


def run_on_ray(
    config: ValidConfig, run_dir: str, backend: str, env: dict[str, str], address: str | None
) -> int:
    """The ranks as Ray Train workers; 0 when every rank finished, 1 when one failed (its error file says
    why, as under torchrun). The local cluster Ray started is shut down whatever happens."""
    import ray
    from ray.train import RunConfig as RayRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    keep = (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "PYTHONUNBUFFERED",
        "PYTHONPATH",
        "WORKBENCH_RESOLVED_BACKEND",
        "WORKBENCH_STRICT_COMM",
        "WORKBENCH_CHECKS",
    )
    ours = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(
        address=address,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {k: env[k] for k in keep if k in env}},
    )
    # Ray's driver replaces them (SIGTERM: abort); ours stop it cleanly
    for sig, handler in ours.items():
        if handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(sig, handler)
    try:
        trainer = TorchTrainer(
            rank_main,
            train_loop_config={"run_dir": run_dir},
            scaling_config=ScalingConfig(
                num_workers=config.world_size,
                use_gpu=backend == "nccl",
                resources_per_worker={"CPU": 1},
            ),
            torch_config=TorchConfig(backend=backend, timeout_s=int(config.timeout_s)),
            run_config=RayRunConfig(name="ray", storage_path=run_dir),
        )
        try:
            trainer.fit()
        except Exception:  # a rank failed: its error file is the report (launcher._failure)
            return 1
        return 0
    finally:
        ray.shutdown()
