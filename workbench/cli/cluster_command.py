"""`workbench cluster up|down|status`: a cluster on this machine, its nodes network namespaces joined by
shaped links (launching/local_cluster.py); `workbench run --cluster NAME` runs across it.

    workbench cluster up --name lab --nodes 2 --ranks-per-node 2 --rate-mbit 1000
    workbench run --dp 4 --cluster lab --out traces/lab-dp4
    workbench cluster status            # every cluster up, its nodes and their processes
    workbench cluster down --name lab   # also after a killed run; --all: every cluster
    workbench cluster up --name lab --slurm  # and Slurm on its nodes (launching/local_slurm.py): sbatch runs there
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from workbench.config import ConfigError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument(
        "--name",
        default=None,
        help="the cluster's name (1–10 lowercase letters/digits; up and down: wb; status: every cluster)",
    )
    p.add_argument("--nodes", type=int, default=2, help="nodes, each a network namespace (up)")
    p.add_argument("--ranks-per-node", type=int, default=2, help="ranks a node runs (up)")
    p.add_argument(
        "--rate-mbit",
        type=float,
        default=1000.0,
        help="each node's link rate in Mbit/s, shaped by tc tbf (up); 0: unshaped",
    )
    p.add_argument("--all", action="store_true", help="down: every cluster on this machine")
    p.add_argument(
        "--slurm",
        action="store_true",
        help="up: also start Slurm on the nodes (munge, slurmctld on node 0, a slurmd in each node)",
    )


def run(a: argparse.Namespace) -> int:
    from workbench.launching import local_cluster as lc

    try:
        if a.action == "up":
            c = lc.LocalCluster(
                name=a.name or "wb",
                nodes=a.nodes,
                ranks_per_node=a.ranks_per_node,
                rate_mbit=a.rate_mbit or None,
            ).up(keep=True)
            rate = f"{c.rate_mbit:g} Mbit/s" if c.rate_mbit else "unshaped"
            print(
                f"cluster {c.name}: {c.nodes} nodes × {c.ranks_per_node} ranks, links {rate}, "
                f"rendezvous {c.rdzv_endpoint}; run on it: workbench run --cluster {c.name} ..."
            )
            if a.slurm:
                _slurm_up(c)
        elif a.action == "down":
            names = lc.clusters() if a.all else [a.name or "wb"]
            for name in names:
                lc.down(name)
            print(f"down: {', '.join(names) or 'no cluster was up'}")
        else:
            names = lc.clusters() if a.all or a.name is None else [a.name]
            print(json.dumps([lc.status(n) for n in names], indent=1))
    except (ConfigError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"workbench cluster: {e}", file=sys.stderr)
        return 2
    return 0


def _slurm_up(c) -> None:
    """Slurm on cluster `c`, or the cluster taken down again and the error raised."""
    from workbench.launching import local_cluster as lc
    from workbench.launching.local_slurm import LocalSlurm

    try:
        slurm = LocalSlurm(cluster=c).up()
    except BaseException:
        lc.down(c.name)
        raise
    print(
        f"slurm: controller {c.address(0)}:6817 in {c.namespace(0)}, a slurmd in each node; submit from a "
        f"node, e.g.\n  SLURM_CONF={slurm.conf} ip netns exec {c.namespace(0)} sbatch JOB.sbatch"
        f"\n(workbench slurm-script writes JOB.sbatch; workbench cluster down --name {c.name} stops it all)"
    )
