"""The sbatch script for a run on Slurm: one task per node, each running the same `workbench run` — torchrun's
agent for that machine — meeting at a c10d rendezvous on the job's first node.

    workbench slurm-script --dp 8 --nnodes 2 --gpus-per-node 4 > job.sbatch     # cli/slurm_command.py
    sbatch job.sbatch

What Slurm gives each task, and what it becomes:

    SLURM_NNODES                          --nnodes
    SLURM_NODEID                          --node-rank
    SLURM_JOB_NODELIST's first node       the rendezvous host, at the address Slurm itself reaches it at
                                          (`scontrol show node`'s NodeAddr: its name where slurm.conf sets none)
    SLURM_JOB_ID                          the job's directory, traces/slurm-<id> (or --out)

Each node's agent writes a run directory of its own, OUT/node<K>: rank 0's holds the whole run (it gathers
every rank's trace over the network, as on machines that share no disk), the others their own ranks' traces.
Two agents never prepare one directory, so a shared filesystem and a local disk work alike. torchrun gives
rank 0 to the agent its rendezvous sorts first by address, normally the first node's: OUT/node0. A run that
checkpoints writes its checkpoints to OUT/checkpoints, which every node must read to resume (a shared
filesystem, as any multi-machine checkpoint needs).

`run_flags` writes a RunConfig back as `workbench run`'s flags (tyro's: a field's name with dashes), only
those that differ from the defaults; tests/test_deploy.py parses them back to the same config, and checks
that deploy/slurm/workbench.sbatch is this module's script for the command line its header names. No torch.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex

from workbench.config import ConfigError, ModelConfig, RunConfig, ValidConfig
from workbench.config.model_config import PRESETS

#: the rendezvous port on the first node
RDZV_PORT = 29500
#: the job's directory when --out is not given (Slurm fills in the job's id)
DEFAULT_OUT = "traces/slurm-$SLURM_JOB_ID"
_TIME = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){1,2}$|^\d+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlurmJob:
    """What the job asks Slurm for: `nodes` machines, one task each with `cpus_per_task` CPUs (None: Slurm's
    default) and `gpus_per_node` GPUs (0: none asked; then the ranks run on CPUs), for at most `time`."""

    nodes: int = 2
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    time: str = "00:30:00"
    job_name: str = "workbench"
    port: int = RDZV_PORT
    #: the job's directory (each node writes OUT/node<K>); shell variables in it are Slurm's
    out: str = DEFAULT_OUT
    #: how a node runs the workbench (`workbench`: the installed command)
    command: str = "workbench"


def check_job(config: RunConfig, job: SlurmJob) -> None:
    """A ConfigError naming the bad value, before any script is written."""
    if job.nodes < 1:
        raise ConfigError(f"nodes={job.nodes}: a Slurm job needs at least one node")
    if config.world_size % job.nodes:
        raise ConfigError(
            f"the run has {config.world_size} ranks (dp×tp×pp×cp), which {job.nodes} nodes cannot share "
            f"evenly: every node runs the same number of ranks"
        )
    per_node = config.world_size // job.nodes
    if job.gpus_per_node and per_node != job.gpus_per_node:
        raise ConfigError(
            f"{config.world_size} ranks on {job.nodes} nodes is {per_node} a node, and the job asks for "
            f"{job.gpus_per_node} GPUs a node: one rank per GPU (change dp, or gpus_per_node)"
        )
    if job.cpus_per_task is not None and job.cpus_per_task < 1:
        raise ConfigError(f"cpus_per_task={job.cpus_per_task}: at least 1 (or leave it out)")
    if not _TIME.match(job.time):
        raise ConfigError(
            f"time={job.time!r}: Slurm's time limit, e.g. 00:30:00, 1-00:00:00 or minutes"
        )
    if not 1 <= job.port <= 65535:
        raise ConfigError(f"port={job.port}: a TCP port, 1 to 65535")


def run_flags(config: RunConfig) -> list[str]:
    """`workbench run`'s flags for `config`: each field that differs from RunConfig's default, in field
    order; a boolean as --x / --no-x, None as the word None, a model given as changes to a preset as JSON."""
    defaults = RunConfig()
    flags: list[str] = []
    for f in dataclasses.fields(RunConfig):
        value = getattr(config, f.name)
        if value == getattr(defaults, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{f.name.replace('_', '-')}")
        elif isinstance(value, ModelConfig):
            flags += [flag, _model_json(value)]
        else:
            flags += [flag, "None" if value is None else str(value)]
    return flags


def _model_json(model: ModelConfig) -> str:
    """The model as changes to the tiny preset (model_from_dict's form)."""
    base = dataclasses.asdict(PRESETS["tiny"])
    changes = {k: v for k, v in dataclasses.asdict(model).items() if base[k] != v}
    return json.dumps(changes, separators=(",", ":"))


def node_command(config: RunConfig, job: SlurmJob) -> str:
    """The command each task runs, with Slurm's variables left for the task's shell to fill in."""
    words = [job.command, "run", *(shlex.quote(f) for f in run_flags(config))]
    words += [
        '--nnodes "$SLURM_NNODES"',
        '--node-rank "$SLURM_NODEID"',
        '--rdzv-endpoint "$WORKBENCH_RDZV"',
        '--out "$WORKBENCH_OUT/node$SLURM_NODEID"',
    ]
    if config.checkpoint_every and config.checkpoint_dir is None:
        words.append('--checkpoint-dir "$WORKBENCH_OUT/checkpoints"')
    return " ".join(words)


def slurm_script(
    config: ValidConfig, job: SlurmJob, *, generated_by: list[str] | None = None
) -> str:
    """The sbatch script that runs `config` as `job` (check_job's ConfigError first). `generated_by`: the
    command line that wrote it, said in its header."""
    check_job(config, job)
    per_node = config.world_size // job.nodes
    on = f"{job.gpus_per_node} GPUs each" if job.gpus_per_node else f"{per_node} CPU ranks each"
    model = config.model if isinstance(config.model, str) else "a model of its own"
    header = [
        "#!/bin/bash",
        f"# {job.nodes} machines, {on}: {model} over all {config.world_size} ranks ({_layout(config)}).",
        *_written_by(generated_by),
        *_HOW.splitlines(),
    ]
    directives = [
        f"--job-name={job.job_name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        *([f"--gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []),
        *([f"--cpus-per-task={job.cpus_per_task}"] if job.cpus_per_task else []),
        f"--time={job.time}",
    ]
    body = [
        "set -euo pipefail",
        # sed reads the whole list (`head -n 1` would leave scontrol writing into a closed pipe)
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        "addr=$(scontrol show node \"$head\" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        f'export WORKBENCH_RDZV="$addr:{job.port}"',
        f'export WORKBENCH_OUT="{job.out}"',
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(node_command(config, job))}",
    ]
    return "\n".join([*header, *(f"#SBATCH {d}" for d in directives), *body]) + "\n"


#: what the script does, said in it
_HOW = """\
#
#   sbatch THIS_FILE
#   tail -f slurm-<jobid>.out                  # every node's output
#
# One task per node, each running the same `workbench run` (torchrun's agent for that machine), meeting at a c10d
# rendezvous on the first node of the job, at the address Slurm reaches it at (its NodeAddr, which is its name where
# slurm.conf sets none). Slurm gives each task its node's index (SLURM_NODEID: torchrun's --node-rank). Each node
# writes a run directory of its own, OUT/node<K>: rank 0's, the first node's, holds the whole run, gathered over
# the network. --kill-on-bad-exit ends every task when one fails; torchrun restarts the ranks of a failed attempt
# itself (--max-restarts). workbench/launching/slurm_script.py writes this file."""


def _written_by(command: list[str] | None) -> list[str]:
    """The command line that wrote the script, a flag and its value never split, over lines of at most
    116 characters."""
    if not command:
        return []
    chunks: list[str] = []
    for word in map(shlex.quote, command):
        if chunks and not word.startswith("--") and chunks[-1].startswith("--"):
            chunks[-1] += " " + word
        else:
            chunks.append(word)
    lines = [""]
    for chunk in chunks:
        if lines[-1] and len(lines[-1]) + 1 + len(chunk) > 112:
            lines.append("    ")
        lines[-1] += (" " if lines[-1].strip() else "") + chunk
    return ["# Written by:", *(f"#   {line}" for line in lines)]


def _layout(config: RunConfig) -> str:
    parts = [
        f"{k}={getattr(config, k)}" for k in ("dp", "tp", "pp", "cp") if getattr(config, k) > 1
    ]
    return " × ".join(parts) or "one rank"
