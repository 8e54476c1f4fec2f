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

import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

from workbench.checkpoint_files import archive_attempt, check_resume
from workbench.config import ConfigError, RunConfig
from workbench.config_rules import RESOLVED_BACKEND, backend_for
from workbench.lifetime import die_with_parent, stop
from workbench.model_config import lr_warning
from workbench.progress import Progress
from workbench.run import Run, load
from workbench.trace.merge import recover_partials, write_merged
from workbench.warm_torchrun import WarmTorchrun, wanted


class RunFailed(RuntimeError):
    """A rank failed; `.rank` is the root cause's rank, `.traceback` its traceback, `.run` what was kept."""

    def __init__(self, message: str, rank: int | None, traceback: str, run: Run) -> None:
        super().__init__(message)
        self.rank, self.traceback, self.run = rank, traceback, run


#: elastic rendezvous: a silent agent is dropped after 5 missed 1-second heartbeats, and a round closes 2 s
#: after the minimum number of agents arrived (torchrun's defaults, 3 × 5 s and 30 s, suit large clusters)
ELASTIC_RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5"


@dataclass(frozen=True)
class Nodes:
    """Multi-machine settings passed to torchrun; the defaults run everything on this machine.

    `nnodes` is a count, or "MIN:MAX" for elastic membership: the run goes on while at least MIN machines'
    agents take part, re-forming its group (and its dp) when one leaves or joins (RunConfig.elastic)."""

    nnodes: int | str = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of the rendezvous (node 0)
    rdzv_id: str = "workbench"

    @property
    def range(self) -> tuple[int, int]:
        """(MIN, MAX) machines."""
        lo, _, hi = str(self.nnodes).partition(":")
        try:
            low, high = int(lo), int(hi or lo)
        except ValueError:
            low = high = 0
        if not 1 <= low <= high:
            raise ConfigError(f"nnodes={self.nnodes!r}: a number of machines ≥ 1, or MIN:MAX with 1 ≤ MIN ≤ MAX")
        return low, high

    @property
    def elastic(self) -> bool:
        return self.range[0] < self.range[1]


def elastic_config(config: RunConfig, nodes: Nodes) -> RunConfig:
    """An elastic launch: the config marked elastic, after checking that every world the machines can form
    (MIN..MAX of them, each with world_size / MAX ranks) is a valid dp for this batch and model."""
    from workbench.config import ConfigError

    low, high = nodes.range
    per_node, cell = config.world_size // high, config.cp * config.tp * config.pp
    for n in range(low, high + 1):
        if (n * per_node) % cell:
            raise ConfigError(f"nnodes={nodes.nnodes}: {n} machine(s) × {per_node} ranks is not a multiple of "
                              f"cp×tp×pp = {cell}; every world the group can shrink to must hold whole dp replicas")
        try:
            config.replace(dp=n * per_node // cell, elastic=True).validate()
        except ConfigError as e:
            raise ConfigError(f"nnodes={nodes.nnodes}: with {n} machine(s) (dp={n * per_node // cell}): {e}") from e
    return config.replace(elastic=True)


def default_run_dir(config: RunConfig) -> str:
    name = config.name or time.strftime("run-%Y%m%d-%H%M%S")
    return os.path.join("traces", name)


def torchrun_command(config: RunConfig, run_dir: str, nodes: Nodes = Nodes(),
                     module: str = "workbench.engine.worker") -> list[str]:
    """torchrun's command line; an elastic one (nnodes MIN:MAX) sizes each machine for MAX of them."""
    from workbench.config import ConfigError

    cmd = [sys.executable, "-m", "torch.distributed.run"]
    low, high = nodes.range
    if high == 1 and nodes.rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1", "--nproc-per-node", str(config.world_size)]
    else:
        if config.world_size % high:
            raise ConfigError(f"world size {config.world_size} (dp×tp×pp) is not divisible by nnodes="
                              f"{nodes.nnodes}: every machine runs the same number of ranks")
        if nodes.rdzv_endpoint is None:
            raise ConfigError("nnodes > 1 needs rdzv_endpoint=HOST:PORT (the first machine's address)")
        cmd += ["--nnodes", str(nodes.nnodes), "--nproc-per-node", str(config.world_size // high),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", nodes.rdzv_endpoint, "--rdzv-id", nodes.rdzv_id]
        cmd += ["--rdzv-conf", ELASTIC_RDZV_CONF] if nodes.elastic else ["--node-rank", str(nodes.node_rank)]
    cmd += ["--max-restarts", str(config.max_restarts), "-m", module, "--run-dir", run_dir]
    return cmd


def _prepare_dir(run_dir: str, resume_step: int | None = None, force: bool = False) -> None:
    """An empty run directory; resuming (`resume_step` given) in an existing one keeps its checkpoints and
    moves the earlier attempt aside (checkpoint_files.archive_attempt). An earlier run there is only
    replaced with `force`."""
    if os.path.isdir(run_dir) and os.listdir(run_dir):
        is_run = any(os.path.exists(os.path.join(run_dir, n)) for n in ("request.json", "config.json"))
        if not is_run:
            raise FileExistsError(f"{run_dir} exists and is not a workbench run directory; choose another out=")
        if resume_step is not None:
            archive_attempt(run_dir, resume_step)
            return
        if not force:
            raise FileExistsError(f"{run_dir} already holds a run: pass force=True (CLI: --force) to replace it, "
                                  f"or choose another out= (left out, each run gets a new traces/run-<time>)")
        shutil.rmtree(run_dir)
    os.makedirs(run_dir, exist_ok=True)


def visible_gpus() -> int:
    """CUDA devices this process sees. torch is imported only where a GPU may exist (or it already is):
    launching from a notebook on a CPU machine costs nothing."""
    if "torch" not in sys.modules and not (shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0")):
        return 0
    import torch

    return torch.cuda.device_count()


def choose_backend(config: RunConfig, nodes: Nodes = Nodes()) -> str:
    """The backend the ranks will use (config_rules.backend_for): NCCL only where every rank of a machine
    has a GPU; a ConfigError naming both counts otherwise — before any process starts."""
    return backend_for(config.backend, config.world_size // nodes.range[1], visible_gpus() if config.backend != "gloo"
                       else 0)


def _joins(run_dir: str, config: RunConfig, nodes: Nodes) -> bool:
    """A multi-machine run whose directory this host already holds with the same request: another agent of
    it on this host (or one rejoining an elastic run) — keep everything there."""
    request = os.path.join(run_dir, "request.json")
    if nodes.range[1] == 1 or not os.path.exists(request):
        return False
    with open(request) as f:
        return f.read() == config.to_json()


def launch(config: RunConfig, out: str | None = None, *, progress: bool = True, nodes: Nodes = Nodes(),
           echo: bool = False, force: bool = False) -> Run:
    """Validate, run with torchrun, and return the loaded Run (or raise RunFailed / ConfigError). An
    earlier run in `out` is replaced only with `force=True` (FileExistsError otherwise)."""
    _warn_lr(config)
    config.validate()
    backend = choose_backend(config, nodes)
    if nodes.elastic:
        config = elastic_config(config, nodes)
    run_dir = os.path.abspath(out or default_run_dir(config))
    if not _joins(run_dir, config, nodes):
        _, step = check_resume(config, run_dir)
        _prepare_dir(run_dir, step if config.resume else None, force)
        with open(os.path.join(run_dir, "request.json"), "w") as f:
            f.write(config.to_json())
    env = rank_env(backend)
    log_path = os.path.join(run_dir, "launcher.log")
    cmd = torchrun_command(config, run_dir, nodes)
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = _start_torchrun(cmd, env, log, log_path, echo)
        rc = _follow(proc, run_dir, config, progress)
    if rc != 0:
        raise _failure(run_dir, rc, log_path)
    return load(run_dir)


def _start_torchrun(cmd: list[str], env: dict[str, str], log, log_path: str,
                    echo: bool = False) -> subprocess.Popen | WarmTorchrun:
    """torchrun, writing into the run's log (or, with `echo`, to the terminal): forked from a process that
    has imported it already where warm launches are on (warm_torchrun.py), else its command as a
    subprocess. Either way it and its ranks end with us (parent-death signals)."""
    if not echo and wanted():
        return WarmTorchrun(cmd, env, log_path)
    return subprocess.Popen(cmd, stdout=None if echo else log, stderr=None if echo else subprocess.STDOUT,
                            env=env, preexec_fn=die_with_parent)


def _warn_lr(config: RunConfig) -> None:
    """A learning rate far above what the model's width trains with: said, not refused (before validation,
    so that it is seen even when another value stops the launch)."""
    try:
        high = lr_warning(config.model_config, config.lr)
    except ConfigError:
        return
    if high:
        warnings.warn(high, stacklevel=3)


def rank_env(backend: str | None = None) -> dict[str, str]:
    """The environment torchrun and the ranks get: one thread per rank, the backend chosen here
    (RESOLVED_BACKEND), and every rendezvous round with a store of its own
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE: rank 0 of each group hosts it), so that no rank reads what a dead
    rank of an earlier round left there. The package is importable by the ranks even when it is used
    from a source checkout."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    chosen = {RESOLVED_BACKEND: backend} if backend is not None else {}
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **chosen,
            "PYTHONPATH": os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")]))}


def ring_demo(ranks: int = 4, numel: int = 3, out: str | None = None, force: bool = False,
              backend: str = "gloo") -> Run:
    """Our four ring collectives once each over `ranks` processes on `numel`·ranks values, traced
    (engine/ring_demo.py): `viz.ring_steps(run, op=...)` replays them. On the CPU with gloo unless asked
    otherwise: a teaching demo of a few numbers runs on any machine (backend='nccl' puts its buffers on
    the GPUs, one per rank)."""
    config = RunConfig(dp=ranks, global_batch=numel * ranks, name="ring-demo", backend=backend).validate()
    chosen = choose_backend(config)
    run_dir = os.path.abspath(out or default_run_dir(config))
    _prepare_dir(run_dir, force=force)
    with open(os.path.join(run_dir, "request.json"), "w") as f:
        f.write(config.to_json())
    with open(os.path.join(run_dir, "ring_demo.json"), "w") as f:
        json.dump({"numel": numel}, f)
    log_path = os.path.join(run_dir, "launcher.log")
    with open(log_path, "w") as log:
        proc = _start_torchrun(torchrun_command(config, run_dir, module="workbench.engine.ring_demo"),
                               rank_env(chosen), log, log_path)
        if proc.wait() != 0:
            raise _failure(run_dir, proc.returncode, log_path)
    return load(run_dir)


def _follow(proc: subprocess.Popen, run_dir: str, config: RunConfig, progress: bool) -> int:
    """Wait for torchrun, showing start-up, then steps as metrics.jsonl grows (plain text: progress.py)."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    shown = Progress(os.path.basename(run_dir), config.steps, config.world_size, enabled=progress)
    rc, read, rows = None, 0, 0  # metrics.jsonl: bytes read so far, and the rows in them
    try:
        while rc is None:
            rc = proc.poll()
            if progress and os.path.exists(metrics):
                if os.path.getsize(metrics) < read:  # a restart trimmed it: count again
                    read = rows = 0
                with open(metrics, "rb") as f:
                    f.seek(read)
                    new = f.read()
                read, rows = read + len(new), rows + new.count(b"\n")
                shown.update(rows)
            if rc is None:
                time.sleep(0.1)
        return rc
    except BaseException:  # Ctrl-C, SIGTERM turned into an exception by the CLI
        stop(proc)
        raise
    finally:
        shown.close(ok=rc == 0)


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

