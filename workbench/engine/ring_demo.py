"""`python -m workbench.engine.ring_demo --run-dir DIR` (torchrun starts it: `launcher.ring_demo`): each of
our ring collectives once over every rank — an all-reduce, a reduce-scatter, an all-gather, a broadcast
from rank 0 — on a buffer of `numel` values, each checked against the backend's own collective and
traced exactly as in training (a `ring_step` span per step, flows between ranks), so that
`viz.ring_steps(run, op=...)` replays each one chunk by chunk. The dp group is the whole world;
`numel` comes from DIR/ring_demo.json (no model is built). `launcher.ring_demo` runs it on gloo (the CPU)
unless asked for NCCL; its buffers are on the rank's device either way."""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from workbench.comm.ring_allreduce import ring_all_reduce
from workbench.comm.ring_primitives import ring_all_gather, ring_broadcast, ring_reduce_scatter
from workbench.config import RunConfig
from workbench.engine.context import RankContext, setup


def run_each(ctx: RankContext, numel: int) -> None:
    """The four ring collectives, each then compared with the backend's (a RuntimeError if one differs).
    Every buffer lives on the rank's device (the CPU on gloo, its GPU on NCCL)."""
    comm, n, r, dev = ctx.comm, ctx.world_size, ctx.rank, ctx.device
    g = torch.Generator().manual_seed(r)
    x = torch.randn(n * numel, generator=g).to(dev)
    ours, ref = x.clone(), x.clone()
    ring_all_reduce(comm, ours, "dp", label="demo")
    dist.all_reduce(ref)
    checks = {"all_reduce": torch.allclose(ours, ref, rtol=1e-5, atol=1e-6)}
    out, ref_out = torch.empty(numel, device=dev), torch.empty(numel, device=dev)
    ring_reduce_scatter(comm, out, x, "dp", label="demo")
    dist.reduce_scatter_tensor(ref_out, x.clone())
    checks["reduce_scatter"] = torch.allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    gathered, ref_gathered = torch.empty(n * numel, device=dev), torch.empty(n * numel, device=dev)
    ring_all_gather(comm, gathered, x[:numel], "dp", label="demo")
    dist.all_gather_into_tensor(ref_gathered, x[:numel].clone())
    checks["all_gather"] = torch.equal(gathered, ref_gathered)
    want = torch.arange(float(n * numel), device=dev)
    b = want.clone() if r == 0 else torch.zeros(n * numel, device=dev)
    ring_broadcast(comm, b, 0, "dp", label="demo")
    checks["broadcast"] = torch.equal(b, want)
    if not all(checks.values()):
        raise RuntimeError(f"rank {r}: our ring differs from the backend's: {checks}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", required=True)
    run_dir = parser.parse_args(argv).run_dir
    torch.set_num_threads(1)
    with open(os.path.join(run_dir, "request.json")) as f:
        config = RunConfig.from_dict(json.load(f))
    ctx = setup(config, run_dir)
    ctx.comm.start_step(0)
    with ctx.recorder.span("ProfilerStep#0", "step", "compute", step=0):
        with open(os.path.join(run_dir, "ring_demo.json")) as f:
            run_each(ctx, json.load(f)["numel"])
    ctx.comm.end_step()  # CUDA: the records with their device times
    ctx.recorder.write(os.path.join(run_dir, f"trace_rank{ctx.rank}.json"))
    ctx.comm.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
