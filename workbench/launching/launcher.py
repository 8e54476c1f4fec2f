"""`launch(config) -> Run`: start a real multi-process run with torchrun, from Python, Jupyter or the CLI.

The launcher validates the configuration first, once (a bad one raises `ConfigError` before any process
starts; a ValidConfig, from `RunConfig.validate()`, is taken as it is), writes the request into the run
directory, and runs `python -m torch.distributed.run` (torchrun) as a subprocess: `--standalone` on one
machine (torchrun picks a free port), or `--nnodes/--node-rank/--rdzv-endpoint` across machines. Each
rank gets one thread. While it runs, a progress bar follows metrics.jsonl; when it fails, `RunFailed`
carries the failing rank's traceback, and whatever the ranks wrote (metrics, traces) stays in the
directory.

No torch is imported here: launching costs the notebook nothing.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import warnings

from workbench.analysis.killed_ranks import killed_ranks, record_killed
from workbench.analysis.run import Run, load
from workbench.config import ConfigError, RunConfig, ValidConfig, validated
from workbench.config.backend import RESOLVED_BACKEND, auto_fallback, backend_for
from workbench.config.model_config import lr_warning
from workbench.engine.checkpoint.files import archive_attempt, check_resume
from workbench.launching.cluster_launch import cluster_nodes, start_agents
from workbench.launching.disk_space import check_disk_space
from workbench.launching.lifetime import Torchrun, die_with_parent, stop
from workbench.launching.local_cluster import LocalCluster, attach
from workbench.launching.memory_fit import check_fits_memory
from workbench.launching.progress import Progress, Speed
from workbench.launching.ray_cluster import check_ray_on_cluster, start_driver, start_ray, stop_ray
from workbench.launching.ray_cluster import ray_address as cluster_ray_address
from workbench.launching.run_lock import RunLock
from workbench.launching.torchrun_command import (
    ONE_MACHINE,
    Nodes,
    check_nsys,
    elastic_config,
    torchrun_command,
)
from workbench.launching.warm_torchrun import WarmTorchrun, wanted
from workbench.trace.merge import recover_partials, write_merged

__all__ = [
    "Nodes",
    "RunFailed",
    "elastic_config",
    "launch",
    "launch_module",
    "ring_demo",
    "torchrun_command",
]


class RunFailed(RuntimeError):
    """A rank failed; `.rank` is the root cause's rank, `.traceback` its traceback, `.run` what was kept."""

    def __init__(self, message: str, rank: int | None, traceback: str, run: Run) -> None:
        super().__init__(message)
        self.rank, self.traceback, self.run = rank, traceback, run


def default_run_dir(config: RunConfig) -> str:
    name = config.name or time.strftime("run-%Y%m%d-%H%M%S")
    return os.path.join("traces", name)


def _prepare_dir(run_dir: str, resume_step: int | None = None, force: bool = False) -> None:
    """An empty run directory; resuming (`resume_step` given) in an existing one keeps its checkpoints and
    moves the earlier attempt aside (checkpoint_files.archive_attempt). An earlier run there is only
    replaced with `force`."""
    if os.path.isdir(run_dir) and os.listdir(run_dir):
        is_run = any(
            os.path.exists(os.path.join(run_dir, n)) for n in ("request.json", "config.json")
        )
        if not is_run:
            raise FileExistsError(
                f"{run_dir} exists and is not a workbench run directory; choose another out="
            )
        if resume_step is not None:
            archive_attempt(run_dir, resume_step)
            return
        if not force:
            raise FileExistsError(
                f"{run_dir} already holds a run: pass force=True (CLI: --force) to replace it, "
                f"or choose another out= (left out, each run gets a new traces/run-<time>)"
            )
        shutil.rmtree(run_dir)
    os.makedirs(run_dir, exist_ok=True)


def visible_gpus() -> int:
    """CUDA devices this process sees. torch is imported only where a GPU may exist (or it already is):
    launching from a notebook on a CPU machine costs nothing."""
    if "torch" not in sys.modules and not (
        shutil.which("nvidia-smi") or os.path.exists("/dev/nvidia0")
    ):
        return 0
    import torch

    return torch.cuda.device_count()


def choose_backend(config: RunConfig, nodes: Nodes = ONE_MACHINE, say: bool = False) -> str:
    """The backend the ranks will use (config/backend.backend_for): NCCL only where every rank of a machine
    has a GPU; 'auto' falls back to gloo on the CPU where there are fewer (and, with `say`, prints the one
    line that says so); an explicit 'nccl' is a ConfigError naming both counts — before any process starts."""
    ranks, gpus = (
        config.world_size // nodes.range[1],
        visible_gpus() if config.backend != "gloo" else 0,
    )
    chosen = backend_for(config.backend, ranks, gpus)
    if say and (note := auto_fallback(config.backend, ranks, gpus)):
        print(note, file=sys.stderr, flush=True)
    return chosen


def _joins(run_dir: str, config: RunConfig, nodes: Nodes) -> bool:
    """A multi-machine run whose directory this host already holds with the same request: another agent of
    it on this host (or one rejoining an elastic run) — keep everything there."""
    request = os.path.join(run_dir, "request.json")
    if nodes.range[1] == 1 or not os.path.exists(request):
        return False
    with open(request) as f:
        return f.read() == config.to_json()


def launch(
    config: RunConfig,
    out: str | None = None,
    *,
    progress: bool = True,
    nodes: Nodes = ONE_MACHINE,
    echo: bool = False,
    force: bool = False,
    launcher: str = "torchrun",
    ray_address: str | None = None,
    check_disk: bool = True,
    check_memory: bool = True,
    cluster: LocalCluster | str | None = None,
) -> Run:
    """Validate (a plain RunConfig, once; a ValidConfig is taken as it is), run with torchrun (or as Ray
    Train workers: launcher='ray', launching/ray_launch.py), and return the loaded Run (or raise RunFailed /
    ConfigError). An earlier run in `out` is replaced only with
    `force=True` (FileExistsError otherwise), and never while it is alive (launching/run_lock.py); a run whose
    files would not fit on out's filesystem is refused unless `check_disk=False` (launching/disk_space.py), and one
    whose predicted peak would not fit in this machine's free memory unless `check_memory=False`
    (launching/memory_fit.py). `cluster` (a LocalCluster that is up, or its name) runs one torchrun agent in
    each of its nodes, across its shaped links (launching/cluster_launch.py)."""
    _warn_lr(config)
    config = validated(config)
    if isinstance(cluster, str):
        cluster = attach(cluster)
    if (
        cluster is not None and launcher == "ray"
    ):  # Ray started on its nodes (launching/ray_cluster.py)
        check_ray_on_cluster(config, cluster, nnodes=nodes.nnodes, ray_address=ray_address)
        ray_address = cluster_ray_address(cluster)
    elif cluster is not None:
        nodes = cluster_nodes(config, cluster, nodes)
    backend = choose_backend(config, nodes, say=True)
    _check_launcher(launcher, config, backend, nodes, ray_address)
    if nodes.elastic:
        config = elastic_config(config, nodes)
    if check_memory and launcher == "torchrun":  # Ray places its workers itself, maybe elsewhere
        check_fits_memory(config, backend, config.world_size // nodes.range[1])
    run_dir = os.path.abspath(out or default_run_dir(config))
    lock = None
    if not _joins(run_dir, config, nodes):
        _, step = check_resume(config, run_dir)
        # before --force may empty it: a live run's directory is refused
        lock = RunLock.acquire(run_dir)
        try:
            if check_disk:
                check_disk_space(config, run_dir, replacing=force and not config.resume)
            _prepare_dir(run_dir, step if config.resume else None, force)
            with open(os.path.join(run_dir, "request.json"), "w") as f:
                f.write(config.to_json())
        except BaseException:
            lock.release()
            raise
    try:
        return _run(
            config,
            run_dir,
            backend=backend,
            nodes=nodes,
            progress=progress,
            echo=echo,
            launcher=launcher,
            ray_address=ray_address,
            cluster=cluster,
        )
    finally:
        # a killed rank's
        for reserved in glob.glob(os.path.join(run_dir, ".error_rank*.reserved")):
            os.remove(reserved)
        if lock is not None:
            lock.release()


def _run(
    config: ValidConfig,
    run_dir: str,
    *,
    backend: str,
    nodes: Nodes,
    progress: bool,
    echo: bool,
    launcher: str,
    ray_address: str | None,
    cluster: LocalCluster | None = None,
) -> Run:
    """Start the ranks (torchrun, torchrun in each node of a local cluster, or Ray) into a prepared
    directory, follow them, load what they wrote."""
    env = rank_env(backend)
    log_path = os.path.join(run_dir, "launcher.log")
    started = time.time()  # the ranks' error-file reservations are this launch's from here on
    if launcher == "ray" and cluster is not None:
        with open(log_path, "w") as log:
            rc = _ray_on_cluster(
                config,
                run_dir,
                cluster=cluster,
                backend=backend,
                env=env,
                log=log,
                progress=progress,
            )
    elif launcher == "ray":
        from workbench.launching.ray_launch import run_on_ray

        with open(log_path, "w") as log:
            log.write(
                f"ray: {config.world_size} Ray Train worker(s) on {ray_address or 'a local cluster'}\n"
            )
        rc = run_on_ray(config, run_dir, backend, env, ray_address)
    elif cluster is not None:
        with open(log_path, "a") as log:
            agents = start_agents(config, run_dir, cluster=cluster, nodes=nodes, env=env, log=log)
            rc = _follow(agents, run_dir, config, progress)
    else:
        cmd = torchrun_command(config, run_dir, nodes)
        with open(log_path, "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            proc = _start_torchrun(
                cmd, env, log, log_path, echo=echo, fork_ranks=backend == "gloo" and not config.nsys
            )
            rc = _follow(proc, run_dir, config, progress)
    if rc != 0:
        raise _failure(run_dir, rc, log_path, config.world_size, started)
    return load(run_dir)


def _ray_on_cluster(
    config: ValidConfig,
    run_dir: str,
    *,
    cluster: LocalCluster,
    backend: str,
    env: dict,
    log,
    progress: bool,
) -> int:
    """Ray on the cluster's nodes, the driver inside node 0, followed like torchrun; Ray stopped after."""
    address = start_ray(cluster, env=env, log=log)  # stops what it started if it fails
    try:
        driver = start_driver(
            cluster, run_dir=run_dir, address=address, backend=backend, env=env, log=log
        )
        began = time.monotonic()
        rc = _follow(driver, run_dir, config, progress)
        log.write(f"ray driver: {time.monotonic() - began:.1f} s\n")
        return rc
    finally:
        stop_ray(cluster)


def _check_launcher(
    launcher: str, config: ValidConfig, backend: str, nodes: Nodes, ray_address: str | None
) -> None:
    """torchrun (with --nsys where asked) or Ray (ray_launch.check_ray): what each cannot do, before launch."""
    if config.node_placement != "block" and config.emulate_link is None:
        if launcher != "torchrun" or nodes.range[1] == 1 or nodes.elastic:
            raise ConfigError(
                f"node_placement={config.node_placement!r} without emulate_link places the grid's ranks on "
                "real nodes (engine/context.place_rank): it needs a torchrun run of a fixed number of "
                "nodes, 2 or more (a cluster, or nnodes=N); on one machine give emulate_link"
            )
        if config.ranks_per_node * nodes.range[1] != config.world_size:
            raise ConfigError(
                f"node_placement={config.node_placement!r} with ranks_per_node={config.ranks_per_node} "
                f"on {nodes.range[1]} nodes: the {config.world_size} ranks are "
                f"{config.world_size // nodes.range[1]} a node; give ranks_per_node that"
            )
    if launcher == "torchrun":
        check_nsys(config, backend)
        if ray_address is not None:
            raise ConfigError("ray_address is for launcher='ray'")
        return
    if launcher != "ray":
        raise ConfigError(f"launcher={launcher!r}: valid are 'torchrun' and 'ray'")
    from workbench.launching.ray_launch import check_ray

    if nodes.range != (1, 1) or nodes.rdzv_endpoint is not None:
        raise ConfigError(
            "launcher='ray' places the workers on the cluster itself: leave nnodes, node_rank and "
            "rdzv_endpoint unset (give the cluster with ray_address)"
        )
    check_ray(config, backend, ray_address)


def _start_torchrun(
    cmd: list[str],
    env: dict[str, str],
    log,
    log_path: str,
    *,
    echo: bool = False,
    fork_ranks: bool = False,
) -> subprocess.Popen | WarmTorchrun:
    """torchrun, writing into the run's log (or, with `echo`, to the terminal): forked from a process that
    has imported it already where warm launches are on (launching/warm_torchrun.py) — with `fork_ranks`
    (CPU ranks) its ranks forked from its agent as well —, else its command as a subprocess. Either way it
    and its ranks end with us (parent-death signals)."""
    if not echo and wanted():
        return WarmTorchrun(cmd, env, log_path, fork_ranks)
    return subprocess.Popen(
        cmd,
        stdout=None if echo else log,
        stderr=None if echo else subprocess.STDOUT,
        env=env,
        preexec_fn=die_with_parent,
    )


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
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **chosen,
        "PYTHONPATH": os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")])),
    }


def ring_demo(
    ranks: int = 4,
    numel: int = 3,
    out: str | None = None,
    force: bool = False,
    backend: str = "gloo",
) -> Run:
    """Our four ring collectives once each over `ranks` processes on `numel`·ranks values, traced
    (engine/ring_demo.py): `viz.ring_steps(run, op=...)` replays them. On the CPU with gloo unless asked
    otherwise: a teaching demo of a few numbers runs on any machine (backend='nccl' puts its buffers on
    the GPUs, one per rank)."""
    config = RunConfig(
        dp=ranks, global_batch=numel * ranks, name="ring-demo", backend=backend
    ).validate()
    files = {"ring_demo.json": json.dumps({"numel": numel})}
    return launch_module(config, "workbench.engine.ring_demo", files=files, out=out, force=force)


def launch_module(
    config: ValidConfig,
    module: str,
    *,
    files: dict[str, str],
    out: str | None = None,
    force: bool = False,
) -> Run:
    """torchrun `python -m module --run-dir DIR` on config's ranks (no training loop: a demo or an exercise
    that sets itself up with engine/context.setup), DIR prepared as for a run — request.json and `files`
    (name → text) written first —, and the Run it leaves loaded; RunFailed (what the ranks wrote kept) if a
    rank fails."""
    chosen = choose_backend(config)
    run_dir = os.path.abspath(out or default_run_dir(config))
    lock = RunLock.acquire(run_dir)
    try:
        _prepare_dir(run_dir, force=force)
        with open(os.path.join(run_dir, "request.json"), "w") as f:
            f.write(config.to_json())
        for name, text in files.items():
            with open(os.path.join(run_dir, name), "w") as f:
                f.write(text)
        log_path = os.path.join(run_dir, "launcher.log")
        started = time.time()
        with open(log_path, "w") as log:
            proc = _start_torchrun(
                torchrun_command(config, run_dir, module=module),
                rank_env(chosen),
                log,
                log_path,
            )
            rc = proc.wait()
            if rc != 0:
                raise _failure(run_dir, rc, log_path, config.world_size, started)
        return load(run_dir)
    finally:
        lock.release()


def _follow(proc: Torchrun, run_dir: str, config: ValidConfig, progress: bool) -> int:
    """Wait for torchrun, showing start-up, then steps as metrics.jsonl grows (plain text: launching/progress.py), with
    tokens/s and, on GPUs, MFU."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    shown = Progress(os.path.basename(run_dir), config.steps, config.world_size, enabled=progress)
    speed = Speed(run_dir, config)
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
                new = new[: new.rfind(b"\n") + 1]  # whole rows only: rank 0 may be writing one
                read, rows = read + len(new), rows + new.count(b"\n")
                shown.update(rows, speed.line(new))
            if rc is None:
                time.sleep(0.1)
        return rc
    except BaseException:  # Ctrl-C, SIGTERM turned into an exception by the CLI
        stop(proc)
        raise
    finally:
        shown.close(ok=rc == 0)


def _failure(run_dir: str, rc: int, log_path: str, world_size: int, since: float) -> RunFailed:
    """The failed run's root cause as RunFailed; what the ranks wrote is kept (and, disk allowing, each killed
    rank's trace rebuilt from its stream and the merged trace.json written). A rank that ran no handler gets the
    error file it could not write (analysis/killed_ranks.py), stamped with its last sign of life."""
    with open(log_path) as f:
        log = f.read()
    log_tail = log[-4000:]
    # before its stream becomes its trace file
    killed = killed_ranks(run_dir, log, world_size, since)
    try:
        recover_partials(run_dir)
        write_merged(run_dir)
    except OSError as e:  # a full disk: the error files, written first, say why
        print(f"[workbench] the merged trace was not written: {e}", file=sys.stderr)
    for k in killed:
        record_killed(run_dir, k)
    run = load(run_dir)
    errors = sorted(run.errors, key=lambda e: (e.get("secondary", False), e.get("time", 0)))
    if not errors:
        return RunFailed(
            f"torchrun exited with code {rc} and no rank reported an error; log:\n{log_tail}",
            None,
            log_tail,
            run,
        )
    root = errors[0]
    others = ", ".join(f"rank {e['rank']}: {e['type']}" for e in errors[1:])
    if root["type"] == "Killed":  # its message names the rank and the signal; it has no traceback
        return RunFailed(
            f"{root['message']}\n(run directory kept: {run_dir}"
            f"{'; after it, and because of it: ' + others if others else ''})",
            root["rank"],
            "",
            run,
        )
    message = (
        f"rank {root['rank']} failed: {root['type']}: {root['message']}\n"
        f"(run directory kept: {run_dir}{'; then ' + others if others else ''})\n\n"
        f"--- traceback of rank {root['rank']} ---\n{root['traceback']}"
    )
    return RunFailed(message, root["rank"], root["traceback"], run)
