"""torchrun's command line for a launch: one machine (`--standalone`, torchrun picks a free port), several
(`--nnodes/--node-rank/--rdzv-endpoint`), or elastic (`--nnodes MIN:MAX`); and with `nsys`, each rank wrapped
in Nsight Systems (`nsys profile -t cuda,nvtx,osrt`, one report per rank in RUN/nsys/). No torch here.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass

from workbench.config import ConfigError, ValidConfig

#: elastic rendezvous: a silent agent is dropped after 5 missed 1-second heartbeats, and a round closes 2 s
#: after the minimum number of agents arrived (torchrun's defaults, 3 × 5 s and 30 s, suit large clusters)
ELASTIC_RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=5"


@dataclass(frozen=True, kw_only=True)
class Nodes:
    """Multi-machine settings passed to torchrun; the defaults run everything on this machine.

    `nnodes` is a count, or "MIN:MAX" for elastic membership: the run goes on while at least MIN machines'
    agents take part, re-forming its group (and its dp) when one leaves or joins (RunConfig.elastic)."""

    nnodes: int | str = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # host:port of the rendezvous (node 0)
    rdzv_id: str = "workbench"
    #: whether this machine's agent hosts the rendezvous store (torchrun's rdzv-conf is_host); None: torchrun
    #: decides by host name, which machines that share one (a local cluster's namespaces) cannot
    hosts_rendezvous: bool | None = None
    #: the address other machines reach this one at (torchrun's --local-addr, which its rank 0 publishes as
    #: MASTER_ADDR); None: torchrun takes the host's name, which inside a namespace may not resolve
    local_addr: str | None = None

    @property
    def range(self) -> tuple[int, int]:
        """(MIN, MAX) machines."""
        lo, _, hi = str(self.nnodes).partition(":")
        try:
            low, high = int(lo), int(hi or lo)
        except ValueError:
            low = high = 0
        if not 1 <= low <= high:
            raise ConfigError(
                f"nnodes={self.nnodes!r}: a number of machines ≥ 1, or MIN:MAX with 1 ≤ MIN ≤ MAX"
            )
        return low, high

    @property
    def elastic(self) -> bool:
        return self.range[0] < self.range[1]


#: the default: every rank on this machine
ONE_MACHINE = Nodes()


def elastic_config(config: ValidConfig, nodes: Nodes) -> ValidConfig:
    """An elastic launch: the config marked elastic, after checking that every world the machines can form
    (MIN..MAX of them, each with world_size / MAX ranks) is a valid dp for this batch and model. Each world
    is its own config (its dp, elastic=True), validated once; the MAX machines' is the one launched. Where
    `config` is already that world (elastic=True, its own dp), it is taken as it is, not checked again."""
    low, high = nodes.range
    per_node, cell = config.world_size // high, config.cp * config.tp * config.pp
    world = config
    for n in range(low, high + 1):
        if (n * per_node) % cell:
            raise ConfigError(
                f"nnodes={nodes.nnodes}: {n} machine(s) × {per_node} ranks is not a multiple of "
                f"cp×tp×pp = {cell}; every world the group can shrink to must hold whole dp replicas"
            )
        dp = config.dp if n == high else n * per_node // cell
        twin = config.replace(dp=dp, elastic=True)
        try:
            world = config if twin == config else twin.validate()
        except ConfigError as e:
            raise ConfigError(f"nnodes={nodes.nnodes}: with {n} machine(s) (dp={dp}): {e}") from e
    return world


def torchrun_command(
    config: ValidConfig,
    run_dir: str,
    nodes: Nodes = ONE_MACHINE,
    module: str = "workbench.launching.worker",
) -> list[str]:
    """torchrun's command line; an elastic one (nnodes MIN:MAX) sizes each machine for MAX of them."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    low, high = nodes.range
    if high == 1 and nodes.rdzv_endpoint is None:
        cmd += ["--standalone", "--nnodes", "1", "--nproc-per-node", str(config.world_size)]
    else:
        if config.world_size % high:
            raise ConfigError(
                f"world size {config.world_size} (dp×tp×pp) is not divisible by nnodes="
                f"{nodes.nnodes}: every machine runs the same number of ranks"
            )
        if nodes.rdzv_endpoint is None:
            raise ConfigError(
                "nnodes > 1 needs rdzv_endpoint=HOST:PORT (the first machine's address)"
            )
        cmd += [
            "--nnodes",
            str(nodes.nnodes),
            "--nproc-per-node",
            str(config.world_size // high),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            nodes.rdzv_endpoint,
            "--rdzv-id",
            nodes.rdzv_id,
        ]
        conf = [ELASTIC_RDZV_CONF] if nodes.elastic else []
        if nodes.hosts_rendezvous is not None:
            conf.append(f"is_host={int(nodes.hosts_rendezvous)}")
        if conf:
            cmd += ["--rdzv-conf", ",".join(conf)]
        if not nodes.elastic:
            cmd += ["--node-rank", str(nodes.node_rank)]
        if nodes.local_addr is not None:
            cmd += ["--local-addr", nodes.local_addr]
    cmd += ["--max-restarts", str(config.max_restarts)]
    # torchrun runs nsys, which runs the rank: one report per rank, named by its RANK
    if config.nsys:
        return cmd + [
            "--no-python",
            *NSYS_PROFILE,
            "-o",
            f"{run_dir}/nsys/rank%q{{RANK}}",
            sys.executable,
            "-u",
            "-m",
            module,
            "--run-dir",
            run_dir,
        ]
    return cmd + ["-m", module, "--run-dir", run_dir]


#: Nsight Systems on each rank: CUDA API and kernels, our NVTX ranges (every span is one), OS runtime calls
NSYS_PROFILE = ["nsys", "profile", "-t", "cuda,nvtx,osrt", "--force-overwrite", "true"]


def check_nsys(config: ValidConfig, backend: str) -> None:
    """`nsys`: Nsight Systems must be on PATH and the ranks on CUDA (it profiles kernels) — a ConfigError
    naming which is missing, before any process starts."""
    if not config.nsys:
        return
    if shutil.which("nsys") is None:
        raise ConfigError(
            "nsys=True (--nsys): Nsight Systems' `nsys` is not on PATH; install NVIDIA Nsight Systems "
            "(developer.nvidia.com/nsight-systems) and put its bin/ on PATH, or leave --nsys off "
            "(--profile-steps A:B gives torch.profiler's trace instead)"
        )
    if backend != "nccl":
        raise ConfigError(
            f"nsys=True (--nsys) profiles CUDA ranks, and this run's backend is {backend!r} (no GPU "
            f"per rank here); on the CPU use --profile-steps A:B (torch.profiler) instead"
        )
