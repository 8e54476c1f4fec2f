"""`workbench slurm-script`: the sbatch script for a run on Slurm (launching/slurm_script.py), on stdout.

    workbench slurm-script --model gpt2-small --dp 4 --tp 2 --nnodes 2 --gpus-per-node 4 > job.sbatch
    sbatch job.sbatch

The run's settings are `workbench run`'s flags (a `--config` file too); `--nnodes` is the number of nodes the
job asks for and `--out` its directory (default traces/slurm-<job id>). The job's own options are read first:
`--gpus-per-node`, `--cpus-per-task`, `--time`, `--job-name`, `--port` (the rendezvous port), `--command` (how a
node runs the workbench). A configuration the job cannot run is refused (exit status 2), and nothing is written.
"""

from __future__ import annotations

import argparse
import sys

from workbench.config import ConfigError


def _job_parser() -> argparse.ArgumentParser:
    from workbench.launching.slurm_script import RDZV_PORT

    p = argparse.ArgumentParser(prog="workbench slurm-script", add_help=False)
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs each node gives (0: CPUs)")
    p.add_argument("--cpus-per-task", type=int, default=None, help="CPUs each node's task gets")
    p.add_argument("--time", default="00:30:00", help="the job's time limit")
    p.add_argument("--job-name", default="workbench", help="the job's name in squeue")
    p.add_argument("--port", type=int, default=RDZV_PORT, help="the rendezvous port")
    p.add_argument("--command", default="workbench", help="how a node runs the workbench")
    return p


def help_text() -> str:
    """What `workbench slurm-script --help` prints: the job's options, then where the run's flags are."""
    return (
        _job_parser().format_help()
        + "\nThe run: workbench run's flags (workbench run --help); --nnodes is the job's nodes, and\n"
        "--out its directory (default traces/slurm-<job id>; each node writes OUT/node<K>)."
    )


def run(argv: list[str]) -> int:
    from workbench.cli.run_command import parse_run
    from workbench.launching.slurm_script import DEFAULT_OUT, SlurmJob, slurm_script

    if "-h" in argv or "--help" in argv:
        print(help_text())
        return 0
    job_args, run_argv = _job_parser().parse_known_args(argv)
    try:
        config, launch = parse_run(run_argv, prog="workbench slurm-script")
        if not launch.nnodes.isdigit():
            raise ConfigError(
                f"--nnodes {launch.nnodes}: a Slurm job's nodes are a number, fixed when it is submitted"
            )
        placed = {"--node-rank": launch.node_rank, "--rdzv-endpoint": launch.rdzv_endpoint}
        placed |= {"--cluster": launch.cluster, "--ray-address": launch.ray_address}
        given = [flag for flag, value in placed.items() if value] + (
            ["--launcher"] if launch.launcher != "torchrun" else []
        )
        if given:
            raise ConfigError(
                f"{', '.join(given)}: the script places each node's agent itself (Slurm's node index "
                f"and its first node); leave them out"
            )
        job = SlurmJob(
            nodes=int(launch.nnodes),
            gpus_per_node=job_args.gpus_per_node,
            cpus_per_task=job_args.cpus_per_task,
            time=job_args.time,
            job_name=job_args.job_name,
            port=job_args.port,
            out=launch.out or DEFAULT_OUT,
            command=job_args.command,
        )
        text = slurm_script(
            config.validate(), job, generated_by=["workbench", "slurm-script", *argv]
        )
    except ConfigError as e:
        print(f"workbench slurm-script: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
