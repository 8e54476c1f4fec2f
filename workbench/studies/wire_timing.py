"""Collectives timed by the clock across a local cluster's shaped links (launching/local_cluster.py): one
process per rank, each started inside its node's namespace —

    ip netns exec wb-NAME-nK  python -m workbench.studies.wire_timing --rank R ...

— joined by a FileStore on the shared filesystem (so no rendezvous crosses the link), gloo binding each
node's `eth0`. Rank 0 reads what left its node before and after each size's repeats (a barrier first, so
that nothing is still queued): the bytes its shaper charged (tbf's own count, `tc -s qdisc`: every TCP
segment with its headers, the acknowledgements of the other way's data too: the wire's bytes) and the bytes
its interface counted (/sys/class/net/eth0/statistics: a segmentation-offload packet of up to 64 KB counted
once, with one set of headers). A full 1448-byte segment costs the wire 1514 bytes (`FULL_SEGMENT`); the
measured ratio is higher where segments are smaller (1.067 at 200–500 Mbit/s, 1.047 at 1 Gbit/s here).

    wire_times(cluster, sizes=(4096, 1 << 20), repeats=8) -> WireTimes
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from workbench.launching.local_cluster import LocalCluster

#: the wire's bytes per payload byte of a full TCP segment, the least the headers cost: MTU 1500 leaves 1448
#: bytes of payload (20 of IP, 32 of TCP with timestamps) in an Ethernet frame of 1514
FULL_SEGMENT = 1514 / 1448
#: the ops timed; each rank's buffer is `size` bytes of fp32
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


@dataclass(kw_only=True)
class WireTimes:
    """Seconds of each repeat, by buffer size in bytes; what left node 0 a call, over each size's repeats:
    the bytes its shaper charged (`shaped_bytes`, tbf's count: the wire's bytes) and the bytes its interface
    counted (`tx_bytes`: a segmentation-offload packet counted once)."""

    op: str
    world: int
    rate_mbit: float | None
    seconds: dict[int, list[float]] = field(default_factory=dict)
    shaped_bytes: dict[int, float] = field(default_factory=dict)
    tx_bytes: dict[int, float] = field(default_factory=dict)


def wire_times(
    cluster: LocalCluster,
    *,
    sizes: tuple[int, ...],
    repeats: int = 8,
    op: str = "all_reduce",
    timeout_s: float = 120.0,
) -> WireTimes:
    """Time `op` over every rank of `cluster` (one process per rank, in its node), `repeats` times per size
    after a barrier and one untimed warm-up call; the cluster must be up."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: one of {OPS}")
    world = cluster.world_size
    with tempfile.TemporaryDirectory(prefix="wb-wire-") as d:
        out = os.path.join(d, "result.json")
        argv = [
            sys.executable,
            "-m",
            "workbench.studies.wire_timing",
            "--world",
            str(world),
            "--store",
            os.path.join(d, "store"),
            "--out",
            out,
            "--op",
            op,
            "--repeats",
            str(repeats),
            "--sizes",
            ",".join(str(s) for s in sizes),
            "--timeout",
            str(timeout_s),
        ]
        procs = []
        for r in range(world):
            node = cluster.node_of(r)
            env = {**os.environ, **cluster.env(node), "OMP_NUM_THREADS": "1"}
            cmd = cluster.exec_argv(node, [*argv, "--rank", str(r)])
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        failed = _wait_all(procs, timeout_s + 60)
        if failed:
            raise RuntimeError(f"wire_times over cluster {cluster.name!r} failed: {failed}")
        with open(out) as f:
            got = json.load(f)
    return WireTimes(
        op=op,
        world=world,
        rate_mbit=cluster.rate_mbit,
        seconds={int(k): v for k, v in got["seconds"].items()},
        shaped_bytes={int(k): v / repeats for k, v in got["shaped"].items()},
        tx_bytes={int(k): v / repeats for k, v in got["tx"].items()},
    )


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> str:
    """'' when every process ended well; else the first failure's error output (all are stopped)."""
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return f"no result after {timeout_s:.0f} s"
    bad = [p for p in procs if p.returncode != 0]
    return (bad[0].stderr.read() if bad[0].stderr else "")[-2000:] if bad else ""


def link_bytes(cluster: LocalCluster, node: int) -> int:
    """Bytes node `node`'s shaper has let out of it so far (0 on an unshaped link)."""
    argv = cluster.exec_argv(node, ["tc", "-s", "qdisc", "show", "dev", "eth0"])
    return _shaped(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def counters() -> tuple[int, int]:
    """This namespace's eth0: bytes its shaper let out so far, and the bytes the interface counted out."""
    shown = subprocess.run(
        ["tc", "-s", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True, check=True
    ).stdout
    with open("/sys/class/net/eth0/statistics/tx_bytes") as tx:
        return _shaped(shown), int(tx.read())


def _shaped(shown: str) -> int:
    """tbf's own count of the bytes it let through (`tc -s qdisc show`): every segment's headers
    included, as it charges them; 0 where the link is not shaped."""
    sent = re.search(r"qdisc tbf .*?Sent (\d+) bytes", shown, re.S)
    return int(sent.group(1)) if sent else 0


def _worker(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(args.store, args.world),
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.timeout),
    )
    seconds, shaped, tx = {}, {}, {}
    for size in (int(s) for s in args.sizes.split(",")):
        run = _op(args.op, size, args.world)
        run()  # warm-up: gloo's first call on a buffer size sets up its pairs
        ts = []
        # after a barrier: every byte of the warm-up has arrived, so none is still queued on node 0's link
        dist.barrier()
        before = counters() if args.rank == 0 else (0, 0)
        for _ in range(args.repeats):
            dist.barrier()
            t = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t)
        dist.barrier()
        if args.rank == 0:
            after = counters()
            seconds[size], shaped[size], tx[size] = ts, after[0] - before[0], after[1] - before[1]
    if args.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"seconds": seconds, "shaped": shaped, "tx": tx}, f)
    dist.barrier()
    dist.destroy_process_group()


def _op(op: str, size: int, world: int):
    """The call `op` on a buffer of `size` bytes (fp32) each rank holds."""
    import torch
    import torch.distributed as dist

    n = max(world, size // 4 // world * world)
    buf = torch.ones(n)
    if op == "all_reduce":
        return lambda: dist.all_reduce(buf)
    if op == "broadcast":
        return lambda: dist.broadcast(buf, 0)
    shard = torch.empty(n // world)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(buf, shard)
    return lambda: dist.reduce_scatter_tensor(shard, buf)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for name, kind in (("rank", int), ("world", int), ("repeats", int), ("timeout", float)):
        p.add_argument(f"--{name}", type=kind, required=True)
    for name in ("store", "out", "op", "sizes"):
        p.add_argument(f"--{name}", required=True)
    _worker(p.parse_args())
