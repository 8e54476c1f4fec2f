"""deploy/kubernetes/workbench-job.yaml: a manifest Kubernetes would accept the shape of, whose command line
is one `workbench run` accepts (parsed by our own parser and validated, the torchrun node settings
included)."""

import shlex
from pathlib import Path

import yaml

from workbench.cli import build_parser
from workbench.cli_commands import config_from_args

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
    line = container["args"][0].replace("$(JOB_COMPLETION_INDEX)", "1")  # what Kubernetes substitutes in pod 1
    argv = shlex.split(line)
    assert argv[0] == "workbench"
    a = build_parser().parse_args(argv[1:])
    config = config_from_args(a).validate()
    assert a.nnodes == str(spec["completions"]) and a.node_rank == 1
    assert a.rdzv_endpoint == f"{job['metadata']['name']}-0.{service['metadata']['name']}:29500"
    gpus_per_pod = container["resources"]["limits"]["nvidia.com/gpu"]
    assert config.world_size == gpus_per_pod * spec["completions"], "one rank per GPU over all pods"
