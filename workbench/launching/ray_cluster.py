"""`--launcher ray` across a local cluster's nodes (launching/local_cluster.py): a Ray head in node 0's namespace,
a Ray worker node in each other node's, and the driver inside node 0 — what a user on the first machine of a real
cluster runs:

    ip netns exec wb-NAME-n0  ray start --head --node-ip-address 198.18.0.1 --port 6379 --num-cpus R ...
    ip netns exec wb-NAME-nK  ray start --address 198.18.0.1:6379 --node-ip-address 198.18.0.(K+1) --num-cpus R
    ip netns exec wb-NAME-n0  python -m workbench.launching.ray_cluster --run-dir RUN --address 198.18.0.1:6379

The driver runs in node 0 because the launching process lives in the machine's own namespace, which has no route
to 198.18.0.1 (nothing of the cluster is reachable from outside it, as nothing of a real cluster's private
network is). It is ray_launch.run_on_ray, as for any Ray cluster; the launcher follows it like torchrun. Each node
offers R CPUs, so Ray Train's workers (a CPU each) fill the nodes, R ranks on each; every Ray process inherits its
node's environment (GLOO_SOCKET_IFNAME=eth0, WORKBENCH_NODE), so gloo crosses the shaped links and each rank
records its node.

Ray keeps its files in a directory of the cluster's own (/tmp/wb-ray-NAME), not /tmp/ray: `ray start` leaves the
head's address there (ray_current_cluster), and every `ray.init()` on this machine would then try to join a
cluster it cannot reach. Its processes authenticate with a token of the cluster's own (RAY_AUTH_MODE=token, the
token in that directory): left to itself, `ray start --head` turns token authentication on when a token exists in
~/.ray (a local `ray.init()` writes one) and a worker node's `ray start` does not, and the worker is refused. Ray
is stopped by stopping every process of the cluster's nodes — never `ray stop`, which stops every Ray on the
machine, other users' included. No torch here.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time

from workbench.config import ConfigError, RunConfig, ValidConfig
from workbench.launching.lifetime import die_with_parent
from workbench.launching.local_cluster import LocalCluster, scratch_dir

RAY_PORT = 6379
#: how long one `ray start` may take (measured here: the head 10 s, a worker node 5 s, on 2 loaded cores)
_START_S = 120.0


def check_ray_on_cluster(
    config: ValidConfig, cluster: LocalCluster, *, nnodes: int | str, ray_address: str | None
) -> None:
    """ConfigErrors before anything starts: the run must fill the cluster, which places Ray itself."""
    if ray_address is not None or str(nnodes) != "1":
        raise ConfigError(
            "launcher='ray' with a cluster starts Ray on its nodes itself: leave ray_address and "
            "nnodes out"
        )
    if config.world_size != cluster.world_size:
        raise ConfigError(
            f"the run has {config.world_size} ranks (dp×tp×pp×cp) and cluster {cluster.name!r} "
            f"{cluster.nodes} nodes × {cluster.ranks_per_node} ranks = {cluster.world_size}: Ray "
            f"offers each node's ranks as its CPUs, one worker each"
        )


def ray_address(cluster: LocalCluster) -> str:
    return f"{cluster.address(0)}:{RAY_PORT}"


def temp_dir(cluster: LocalCluster) -> str:
    """Ray's files for this cluster: a fresh private folder in /tmp (short: Ray's socket paths must fit 107
    characters), made by start_ray and named in the cluster's scratch folder, which `down` reads to remove it."""
    with open(os.path.join(scratch_dir(cluster.name), RAY_TEMP)) as f:
        return f.read().strip()


#: the file in the cluster's scratch folder that names Ray's folder (local_cluster.down removes what it names)
RAY_TEMP = "remove-also.ray"


def ray_env(cluster: LocalCluster) -> dict[str, str]:
    """What every Ray process of the cluster runs with: its token, no usage report."""
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": os.path.join(temp_dir(cluster), "auth_token"),
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def start_ray(cluster: LocalCluster, *, env: dict[str, str], log) -> str:
    """The head in node 0, a worker node in each other; the head's address. RuntimeError (Ray stopped again)
    where one does not start within _START_S."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    busy = {
        ns: pids
        for ns in map(cluster.namespace, range(cluster.nodes))
        if (pids := cluster.host.pids(ns))
    }
    if busy:
        raise ConfigError(
            f"cluster {cluster.name!r}'s nodes run processes already ({busy}: a local Slurm, another run): "
            f"Ray is stopped by ending every process of the nodes, so it needs them to itself"
        )
    os.makedirs(scratch_dir(cluster.name), exist_ok=True)
    with open(os.path.join(scratch_dir(cluster.name), RAY_TEMP), "w") as f:
        f.write(tempfile.mkdtemp(prefix=f"wb-ray-{cluster.name}-"))  # 0700, new: nothing planted
    token = ray_env(cluster)["RAY_AUTH_TOKEN_PATH"]
    with open(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(secrets.token_hex(32))
    common = ["--num-cpus", str(cluster.ranks_per_node), "--disable-usage-stats"]
    common += ["--temp-dir", temp_dir(cluster)]
    head = ["--head", "--port", str(RAY_PORT), "--include-dashboard=false"]
    try:
        for k in range(cluster.nodes):
            where = head if k == 0 else ["--address", ray_address(cluster)]
            argv = [ray, "start", *where, "--node-ip-address", cluster.address(k), *common]
            _start(cluster, k, argv, env=env, log=log)
    except BaseException:
        stop_ray(cluster)
        raise
    return ray_address(cluster)


def _start(cluster: LocalCluster, node: int, argv: list[str], *, env: dict[str, str], log) -> None:
    log.write(" ".join(cluster.exec_argv(node, argv)) + "\n")
    log.flush()
    began = time.monotonic()
    try:
        done = subprocess.run(
            cluster.exec_argv(node, argv),
            env={**env, **cluster.env(node), **ray_env(cluster)},
            capture_output=True,
            text=True,
            timeout=_START_S,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"`ray start` in node {node} did not end within {_START_S:.0f} s"
        ) from None
    log.write(f"ray start in node {node}: {time.monotonic() - began:.1f} s\n")
    if done.returncode != 0:
        raise RuntimeError(f"`ray start` in node {node} failed:\n{done.stderr[-2000:]}")


def start_driver(
    cluster: LocalCluster, *, run_dir: str, address: str, backend: str, env: dict[str, str], log
) -> subprocess.Popen:
    """The driver inside node 0, writing into `log`; it ends with the launching process."""
    argv = [sys.executable, "-m", "workbench.launching.ray_cluster", "--run-dir", run_dir]
    argv += ["--address", address, "--backend", backend]
    log.write(" ".join(cluster.exec_argv(0, argv)) + "\n")
    log.flush()
    return subprocess.Popen(
        cluster.exec_argv(0, argv),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**env, **cluster.env(0), **ray_env(cluster)},
        preexec_fn=die_with_parent,
    )


def stop_ray(cluster: LocalCluster, grace_s: float = 10.0) -> None:
    """Every process of the cluster's nodes stopped (SIGTERM, SIGKILL after `grace_s`), Ray's files removed."""
    cluster.host.stop_processes(
        [cluster.namespace(k) for k in range(cluster.nodes)], grace_s=grace_s
    )
    named = os.path.join(scratch_dir(cluster.name), RAY_TEMP)
    if os.path.exists(named):
        shutil.rmtree(temp_dir(cluster), ignore_errors=True)
        os.remove(named)


def main(argv: list[str] | None = None) -> int:
    """The driver: the run's request, run as Ray Train workers on the cluster at --address."""
    from workbench.launching.ray_launch import run_on_ray

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--backend", required=True)
    args = parser.parse_args(argv)
    with open(os.path.join(args.run_dir, "request.json")) as f:
        config = RunConfig.from_dict(json.load(f)).validate()
    return run_on_ray(config, args.run_dir, args.backend, dict(os.environ), args.address)


if __name__ == "__main__":
    sys.exit(main())
