"""What one rank knows about its place in the run, built once by `setup` and passed explicitly:
the config, the rank grid and its process groups (each with the config's timeout), the device, the
trace recorder, the memory tracker (with --profile-memory, the memory profile it marks) and the traced
communicator. No globals.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from workbench.comm import strict, torch_flight_recorder
from workbench.comm.device_timing import DeviceClock, enable_nccl_timing
from workbench.comm.emulated_link import EmulatedNetwork, parse_links
from workbench.comm.groups import ProcessGroups
from workbench.comm.traced import Communicator
from workbench.config import RunConfig
from workbench.config.backend import RESOLVED_BACKEND, backend_for
from workbench.config.grid import RankGrid
from workbench.engine.restart import restart_count
from workbench.measure.memory import MemoryTracker
from workbench.measure.memory_profile import MemoryProfile
from workbench.trace import strict_json
from workbench.trace.disk import writing
from workbench.trace.recorder import TraceRecorder
from workbench.trace.step_clock import StepClock


@dataclass(kw_only=True)
class RankContext:
    """What one rank needs, built once by `setup` and passed explicitly: `parallelize` hands each piece
    the collaborators it uses (the communicator, the recorder, the memory tracker …) from here."""

    config: RunConfig
    run_dir: str
    rank: int
    world_size: int
    backend: str
    device: torch.device
    grid: RankGrid
    groups: ProcessGroups
    recorder: TraceRecorder
    memory: MemoryTracker
    #: --profile-memory: the allocator's profile, handed to the memory tracker (whose snapshots mark it)
    #: and started by the training loop before the model is built (None: not asked)
    memory_profile: MemoryProfile | None
    comm: Communicator
    hosts: list[str]


def resolve_backend(requested: str) -> str:
    """The launcher's choice (RESOLVED_BACKEND); where torchrun was started by hand (Slurm, Kubernetes), the
    same rule on this machine: NCCL only where each of its LOCAL_WORLD_SIZE ranks has a GPU."""
    chosen = os.environ.get(RESOLVED_BACKEND)
    if chosen:
        return chosen
    per_machine = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    return backend_for(
        requested, per_machine, torch.cuda.device_count() if requested != "gloo" else 0
    )


def setup(config: RunConfig, run_dir: str) -> RankContext:
    """Join the process group (with the config's timeout), build the grid, agree on the clock."""
    backend = resolve_backend(config.backend)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # an elastic run's config already follows WORLD_SIZE (restart.py)
    if world_size != config.world_size:
        raise RuntimeError(
            f"torchrun started {world_size} processes but dp×cp×tp×pp = "
            f"{config.dp}×{config.cp}×{config.tp}×{config.pp} = {config.world_size}: "
            f"launch with --nproc-per-node × --nnodes = {config.world_size}"
        )
    # torch's record of its collectives, dumped on failure
    torch_flight_recorder.enable(run_dir, backend)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        enable_nccl_timing()  # before the process group: NCCL times its kernels (comm/device_timing.py)
    else:
        device = torch.device("cpu")
        # Intel's oneCCL bindings register the backend when imported (config/rules.py)
        if backend == "ccl":
            import oneccl_bindings_for_pytorch  # noqa: F401
    if not dist.is_initialized():  # Ray Train joined it itself (launching/ray_launch.py)
        dist.init_process_group(
            backend,
            timeout=timedelta(seconds=config.timeout_s),
            store=attempt_store(config),
            rank=rank,
            world_size=world_size,
            device_id=device if backend == "nccl" else None,
        )
    grid = RankGrid(dp=config.dp, tp=config.tp, pp=config.pp, cp=config.cp, ep=config.ep)
    groups = ProcessGroups.create(
        grid,
        rank,
        config.timeout_s,
        ranks_per_node(config) if config.allreduce == "hierarchical" else 0,
    )
    if backend == "nccl":
        warm_up(groups, device)
    name = config.name or os.path.basename(os.path.abspath(run_dir))
    step_clock = StepClock()
    clock = None
    if device.type == "cuda":  # communication and fast steps' spans on device time
        clock = DeviceClock(step_clock.now_us, measured=lambda: step_clock.measured)
    recorder = TraceRecorder(
        rank=rank,
        world_size=world_size,
        backend=backend,
        coords=grid.coords(rank),
        run_name=name,
        enabled=config.trace,
        clock=step_clock,
        device_clock=clock,
        # CUDA: every span an NVTX range
        nvtx=(torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop) if clock is not None else None,
        # every tensor checked as NCCL would (comm/strict.py)
        # and the node it ran on: torchrun's node rank, and the node's name (a local cluster's namespace)
        info={"strict_comm": strict.enabled(), **node_info()},
    )
    profile = MemoryProfile(device, run_dir, rank) if config.profile_memory else None
    memory = MemoryTracker(recorder, device, profile=profile)
    comm = Communicator(
        groups,
        recorder,
        memory=memory,
        clock=clock,
        network=emulated_network(config),
        device=device,
        timeout_s=config.timeout_s,
    )
    # Clock agreement: t = 0 is the exit of this barrier on every rank; record wall-clock offsets.
    comm.barrier()
    recorder.set_epoch()
    walls: list[Any] = [None] * world_size
    dist.all_gather_object(walls, (time.time_ns(), node_info()["node"]))
    recorder.set_clock_offset((walls[rank][0] - walls[0][0]) / 1000.0)
    return RankContext(
        config=config,
        run_dir=run_dir,
        rank=rank,
        world_size=world_size,
        backend=backend,
        device=device,
        grid=grid,
        groups=groups,
        recorder=recorder,
        memory=memory,
        memory_profile=profile,
        comm=comm,
        hosts=[w[1] for w in walls],
    )


def node_info() -> dict[str, Any]:
    """This rank's node: its name (WORKBENCH_NODE, which a local cluster sets to the node's namespace, else
    the host's name) and torchrun's node rank (GROUP_RANK)."""
    return {
        "node": os.environ.get("WORKBENCH_NODE") or socket.gethostname(),
        "node_rank": int(os.environ.get("GROUP_RANK", "0")),
    }


def place_rank(config: RunConfig) -> int:
    """This process's rank in the grid. torchrun numbers each node's ranks consecutively (RANK = GROUP_RANK ·
    LOCAL_WORLD_SIZE + LOCAL_RANK), and Megatron's order (config/grid.py) then keeps each tp group inside a
    node: the placement rule. node_placement='round-robin' on real nodes (no emulated link) breaks it on
    purpose, to measure it: grid rank g runs on node g mod N (g = LOCAL_RANK · N + GROUP_RANK), each tp
    group spread over the nodes. RANK is rewritten before the process group is joined, so that everything
    after (the groups, the trace, the files) numbers this process as the grid does; rank 0, whose store
    the others join, stays rank 0."""
    rank = int(os.environ.get("RANK", 0))
    if config.node_placement == "block" or config.emulate_link is not None:
        return rank
    local, world = int(os.environ["LOCAL_WORLD_SIZE"]), int(os.environ["WORLD_SIZE"])
    if local != config.ranks_per_node or world % local:
        raise RuntimeError(
            f"node_placement={config.node_placement!r} with ranks_per_node={config.ranks_per_node}: "
            f"torchrun started {local} ranks on this node, {world} in all"
        )
    placed = int(os.environ["LOCAL_RANK"]) * (world // local) + int(os.environ["GROUP_RANK"])
    os.environ["RANK"] = str(placed)
    return placed


def warm_up(groups: ProcessGroups, device: torch.device) -> None:
    """One small all-reduce on each of this rank's groups, in a fixed order (every rank goes through the
    same axes in the same order, so no two groups wait on each other). NCCL builds a group's communicator
    at its first collective, which every member must join — and a pipeline's first use of its group is a
    batch of transfers between two neighbours only (torch's batch_isend_irecv documents the rule)."""
    one = torch.ones(1, device=device)
    for axis in ("pp", "dp", "cp", "dp_cp", "ep", "edp", "tp", "dp_intra", "dp_inter"):
        if groups.groups.get(axis) is not None and groups.size(axis) > 1:
            dist.all_reduce(one, group=groups.groups[axis])
    torch.cuda.synchronize(device)


def emulated_network(config: RunConfig) -> EmulatedNetwork | None:
    """--emulate-link's machines (a teaching device): ranks_per_node ranks each, or the real machine's."""
    if config.emulate_link is None:
        return None
    return EmulatedNetwork(
        links=parse_links(config.emulate_link),
        ranks_per_node=ranks_per_node(config),
        placement=config.node_placement,
        world_size=config.world_size,
    )


def ranks_per_node(config: RunConfig) -> int:
    """The machines' size: ranks_per_node (emulated machines), or the real one (LOCAL_WORLD_SIZE)."""
    return config.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", config.world_size))


def attempt_store(config: RunConfig) -> dist.Store:
    """torchrun's store (env://). Where torchrun shares its agents' store with the ranks (its default;
    the launcher turns it off, launcher.rank_env) that one store outlives restarts, and without a prefix
    naming the restart a restarted rank can read the address a dead rank of the failed attempt published
    and fail to connect (measured here: gloo's "connectFullMesh … Connection refused"). Otherwise every
    rendezvous round has a store of its own and the prefix is constant — it must be: after an elastic
    re-formation the agents' restart counts differ."""
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=config.timeout_s)))
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return dist.PrefixStore(f"workbench/attempt{restart_count()}" if shared else "workbench", store)


def write_resolved_config(ctx: RankContext, params: int, params_per_rank: int) -> None:
    """config.json: the request plus what this launch resolved (model dims, backend, device, hosts, grid)."""
    cfg = ctx.config
    resolved = {
        **cfg.to_dict(),
        "model": {
            "preset": cfg.model if isinstance(cfg.model, str) else None,
            **cfg.model_config.__dict__,
        },
        "params": params,
        "params_per_rank": params_per_rank,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "device_name": torch.cuda.get_device_name(ctx.device)
        if ctx.device.type == "cuda"
        else platform.processor(),
        "local_batch": cfg.local_batch,
        "torch_version": torch.__version__,
        "hosts": ctx.hosts,
        "grid": {r: ctx.grid.coords(r) for r in range(ctx.world_size)},
    }
    write_json(os.path.join(ctx.run_dir, "config.json"), resolved)


def write_json(path: str, obj: Any) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = f"{path}.tmp"
    with writing(path, os.path.basename(path)), open(tmp, "w") as f:
        f.write(strict_json.dumps(obj, indent=2))
    os.replace(tmp, path)
