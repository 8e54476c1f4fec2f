"""The deploy files: a Kubernetes Indexed Job, a Slurm batch script and a Volcano job, each running a command line
`workbench run` accepts (parsed by our own parser and validated, the torchrun node settings included); the Slurm
script is the one `workbench slurm-script` writes, and a run config survives being written as flags and read back."""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workbench import ConfigError, ModelConfig, RunConfig
from workbench.cli.run_command import parse_run
from workbench.launching.slurm_script import SlurmJob, run_flags, slurm_script

MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "workbench-job.yaml"


def test_the_kubernetes_job_runs_a_command_workbench_accepts():
    docs = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}
    service, job = docs["Service"], docs["Job"]
    assert service["spec"]["clusterIP"] == "None", "a headless service names the pods"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    container = pod["containers"][0]
    # what Kubernetes substitutes in pod 1
    line = container["args"][0].replace("$(JOB_COMPLETION_INDEX)", "1")
    argv = shlex.split(line)
    assert argv[:2] == ["workbench", "run"]
    config, a = parse_run(argv[2:])
    config = config.validate()
    assert a.nnodes == str(spec["completions"]) and a.node_rank == 1
    assert a.rdzv_endpoint == f"{job['metadata']['name']}-0.{service['metadata']['name']}:29500"
    gpus_per_pod = container["resources"]["limits"]["nvidia.com/gpu"]
    assert config.world_size == gpus_per_pod * spec["completions"], "one rank per GPU over all pods"


SBATCH = MANIFEST.parent.parent / "slurm" / "workbench.sbatch"
VCJOB = MANIFEST.parent.parent / "volcano" / "workbench-vcjob.yaml"


def _accepted(line: str, env: dict[str, str]):
    """`line` with the scheduler's variables filled in, through `workbench run`'s parser and validation."""
    for name, value in sorted(env.items(), key=lambda kv: -len(kv[0])):
        line = line.replace(f'"${name}"', value).replace(f"${name}", value)
    argv = shlex.split(line)
    assert argv[:2] == ["workbench", "run"], argv[:2]
    config, a = parse_run(argv[2:])
    return a, config.validate()


def test_the_slurm_script_runs_a_command_workbench_accepts():
    text = SBATCH.read_text()
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0, "valid bash"
    directives = dict(
        line.split()[1].lstrip("-").split("=", 1)
        for line in text.splitlines()
        if line.startswith("#SBATCH ")
    )
    nodes, gpus = int(directives["nodes"]), int(directives["gpus-per-node"])
    assert directives["ntasks-per-node"] == "1", "one torchrun agent per machine"
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    inner = shlex.split(srun)[-1]  # bash -c '...': the command each task runs
    a, config = _accepted(
        inner,
        {
            "SLURM_NNODES": str(nodes),
            "SLURM_NODEID": "1",
            "WORKBENCH_RDZV": "node0:29500",
            "WORKBENCH_OUT": "traces/slurm-42",
        },
    )
    assert a.nnodes == str(nodes) and a.node_rank == 1 and a.rdzv_endpoint == "node0:29500"
    assert a.out == "traces/slurm-42/node1", "each node writes a run directory of its own"
    assert config.checkpoint_dir == "traces/slurm-42/checkpoints", (
        "one place every node resumes from"
    )
    assert config.world_size == nodes * gpus, "one rank per GPU over all nodes"
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)' in text, (
        "the first node hosts it"
    )


def test_the_slurm_script_is_the_one_workbench_writes():
    """deploy/slurm/workbench.sbatch is `workbench slurm-script`'s output for the command its header names."""
    lines = SBATCH.read_text().splitlines()
    first = lines.index("# Written by:") + 1
    command = []
    for line in lines[first:]:
        if not line.startswith("#   "):
            break
        command += shlex.split(line[4:])
    assert command[:2] == ["workbench", "slurm-script"], command
    written = subprocess.run(
        [sys.executable, "-m", "workbench.cli", *command[1:]], capture_output=True, text=True
    )
    assert written.returncode == 0, written.stderr
    assert written.stdout == SBATCH.read_text(), (
        "deploy/slurm/workbench.sbatch differs from what workbench writes: run the command in its header "
        "again, into it"
    )


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"dp": 4, "tp": 2, "precision": "bf16", "grad_clip": None, "trace": False},
        {"model": ModelConfig(hidden=64, heads=8, bias=False), "lr": 1e-4, "name": "a b"},
        {"emulate_link": "ib", "sequence_parallel": True, "tp": 2, "dp": 2},
    ],
)
def test_run_flags_give_back_the_same_config(changes):
    config = RunConfig(**changes)
    parsed, _ = parse_run(run_flags(config))
    assert parsed == config


@pytest.mark.parametrize(
    ("config", "job", "match"),
    [
        (RunConfig(dp=3, global_batch=12), SlurmJob(nodes=2), "3 ranks .* 2 nodes cannot share"),
        (RunConfig(dp=4), SlurmJob(nodes=2, gpus_per_node=4), "2 a node.* 4 GPUs a node"),
        (RunConfig(dp=2), SlurmJob(nodes=2, time="half an hour"), "time='half an hour'"),
        (RunConfig(dp=2), SlurmJob(nodes=0), "at least one node"),
    ],
)
def test_a_job_that_cannot_run_the_config_is_refused(config, job, match):
    with pytest.raises(ConfigError, match=match):
        slurm_script(config.validate(), job)


def test_the_slurm_script_command_refuses_what_it_places_itself(capsys):
    from workbench.cli.parser import main

    assert main(["slurm-script", "--dp", "2", "--nnodes", "2", "--node-rank", "1"]) == 2
    assert "--node-rank: the script places" in capsys.readouterr().err
    assert main(["slurm-script", "--dp", "2", "--nnodes", "1:2"]) == 2
    assert "fixed when it is submitted" in capsys.readouterr().err


def test_the_volcano_job_is_gang_scheduled_and_runs_a_command_workbench_accepts():
    job = yaml.safe_load(VCJOB.read_text())
    spec = job["spec"]
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1" and job["kind"] == "Job"
    assert spec["schedulerName"] == "volcano"
    pods = sum(t["replicas"] for t in spec["tasks"])
    assert spec["minAvailable"] == pods, "gang scheduling: every machine or none"
    assert "svc" in spec["plugins"] and "--master=master" in spec["plugins"]["pytorch"]
    port = next(a.split("=")[1] for a in spec["plugins"]["pytorch"] if a.startswith("--port="))
    rank = 0
    for task in spec["tasks"]:  # the pytorch plugin's variables: master first, then the workers
        container = task["template"]["spec"]["containers"][0]
        for _ in range(task["replicas"]):
            a, config = _accepted(
                container["args"][0],
                {
                    "WORLD_SIZE": str(pods),
                    "RANK": str(rank),
                    "MASTER_ADDR": "workbench-master-0.workbench",
                    "MASTER_PORT": port,
                },
            )
            assert a.nnodes == str(pods) and a.node_rank == rank
            assert a.rdzv_endpoint == f"workbench-master-0.workbench:{port}"
            assert config.world_size == container["resources"]["limits"]["nvidia.com/gpu"] * pods
            rank += 1
