"""`launch(config) -> Run`: start a real multi-process run with torchrun, from Python, Jupyter or the CLI.

The launcher validates the configuration first (a bad one raises `ConfigError` before any process
starts), writes the request into the run directory, and runs `python -m torch.distributed.run`
(torchrun) as a subprocess: `--standalone` on one machine (torchrun picks a free port), or
`--nnodes/--node-rank/--rdzv-endpoint` across machines. Each rank gets one thread. While it runs, a
progress bar follows metrics.jsonl; when it fails, `RunFailed` carries the failing rank's traceback,
and whatever the ranks wrote (metrics, traces) stays in the directory.

No torch is imported here: launching costs the notebook nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from workbench.checkpoint_files import archive_attempt, check_resume
from workbench.config import RunConfig
from workbench.run import Run, load
from workbench.trace.merge import recover_partials, write_merged


class RunFailed(RuntimeError):
    """A rank failed; `.rank` is the root cause's rank, `.traceback` its traceback, `.run` what was kept."""

    def __init__(self, message: str, rank: int | None, traceback: str, run: Run) -> None:
        super().__init__(message)
        self.rank, self.traceback, self.run = rank, traceback, run


@dataclass(frozen=True)
class Nodes:
    """Multi-machine settings passed to torchrun; the defaults run everything on this machine."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of the rendezvous (node 0)
    rdzv_id: str = "workbench"


def default_run_dir(config: RunConfig) -> str:
    name = config.name or time.strftime("run-%Y%m%d-%H%M%S")
    return os.path.join("traces", name)


def torchrun_command(config: RunConfig, run_dir: str, nodes: Nodes = Nodes()) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nodes.nnodes == 1 and nodes.rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1", "--nproc-per-node", str(config.world_size)]
    else:
        if config.world_size % nodes.nnodes:
            from workbench.config import ConfigError

            raise ConfigError(f"world size {config.world_size} (dp×tp×pp) is not divisible by nnodes="
                              f"{nodes.nnodes}: every machine runs the same number of ranks")
        if nodes.rdzv_endpoint is None:
            from workbench.config import ConfigError

            raise ConfigError("nnodes > 1 needs rdzv_endpoint=HOST:PORT (the first machine's address)")
        cmd += ["--nnodes", str(nodes.nnodes), "--node-rank", str(nodes.node_rank),
                "--nproc-per-node", str(config.world_size // nodes.nnodes),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", nodes.rdzv_endpoint, "--rdzv-id", nodes.rdzv_id]
    cmd += ["--max-restarts", str(config.max_restarts), "-m", "workbench.engine.worker", "--run-dir", run_dir]
    return cmd


def _prepare_dir(run_dir: str, resume_step: int | None = None) -> None:
    """An empty run directory; resuming (`resume_step` given) in an existing one keeps its checkpoints and
    moves the earlier attempt aside (checkpoint_files.archive_attempt)."""
    if os.path.isdir(run_dir) and os.listdir(run_dir):
        is_run = any(os.path.exists(os.path.join(run_dir, n)) for n in ("request.json", "config.json"))
        if not is_run:
            raise FileExistsError(f"{run_dir} exists and is not a workbench run directory; choose another out=")
        if resume_step is not None:
            archive_attempt(run_dir, resume_step)
            return
        shutil.rmtree(run_dir)
    os.makedirs(run_dir, exist_ok=True)


def launch(config: RunConfig, out: str | None = None, *, progress: bool = True, nodes: Nodes = Nodes(),
           echo: bool = False) -> Run:
    """Validate, run with torchrun, and return the loaded Run (or raise RunFailed / ConfigError)."""
    config.validate()
    run_dir = os.path.abspath(out or default_run_dir(config))
    _, step = check_resume(config, run_dir)
    _prepare_dir(run_dir, step if config.resume else None)
    with open(os.path.join(run_dir, "request.json"), "w") as f:
        f.write(config.to_json())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # Make the package importable by the ranks even when it is used from a source checkout.
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
    log_path = os.path.join(run_dir, "launcher.log")
    cmd = torchrun_command(config, run_dir, nodes)
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=None if echo else log, stderr=None if echo else subprocess.STDOUT,
                                env=env)
        rc = _follow(proc, run_dir, config.steps, progress)
    if rc != 0:
        raise _failure(run_dir, rc, log_path)
    return load(run_dir)


def _follow(proc: subprocess.Popen, run_dir: str, steps: int, progress: bool) -> int:
    metrics = os.path.join(run_dir, "metrics.jsonl")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=os.path.basename(run_dir), unit="step", leave=False)
    done = 0
    try:
        while True:
            rc = proc.poll()
            if bar is not None and os.path.exists(metrics):
                with open(metrics) as f:
                    n = sum(1 for _ in f)
                if n > done:
                    bar.update(n - done)
                    done = n
            if rc is not None:
                return rc
            time.sleep(0.1)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=60)
        raise
    finally:
        if bar is not None:
            bar.close()


def _failure(run_dir: str, rc: int, log_path: str) -> RunFailed:
    recover_partials(run_dir)
    write_merged(run_dir)
    run = load(run_dir)
    errors = sorted(run.errors, key=lambda e: (e.get("secondary", False), e.get("time", 0)))
    with open(log_path) as f:
        log_tail = f.read()[-4000:]
    if not errors:
        return RunFailed(f"torchrun exited with code {rc} and no rank reported an error; log:\n{log_tail}",
                         None, log_tail, run)
    root = errors[0]
    others = ", ".join(f"rank {e['rank']}: {e['type']}" for e in errors[1:])
    message = (f"rank {root['rank']} failed: {root['type']}: {root['message']}\n"
               f"(run directory kept: {run_dir}{'; then ' + others if others else ''})\n\n"
               f"--- traceback of rank {root['rank']} ---\n{root['traceback']}")
    return RunFailed(message, root["rank"], root["traceback"], run)

