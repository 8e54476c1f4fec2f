"""Our ZeRO-1 against torch's ZeroRedundancyOptimizer (with DDP), and our ZeRO-3 against FSDP2
(`torch.distributed.fsdp.fully_shard`), same model, batch and world size, interleaved in one run.

    python benchmarks/zero_vs_torch.py                 # 2 ranks, `small` model
    python benchmarks/zero_vs_torch.py --ranks 4 --rounds 60

Each round runs one training step (forward, backward, gradient synchronisation, AdamW) of each of
the four, in alternating order; rank 0 prints the medians and the ratios ours / torch, each with its 95 % interval.
"""

from __future__ import annotations

import argparse
import sys

from harness import check_same_losses, common_arguments, entry, interleaved_rounds, join, report


def worker(args: argparse.Namespace) -> None:

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.config import PRESETS
    from workbench.data.synthetic import global_batch, shard_rows
    from workbench.model.gpt import GPT
    from workbench.optim.updater import AdamHyper, ShardedAdamWUpdater
    from workbench.parallel.zero import ZeroDataParallel
    from workbench.parallel.zero3 import Zero3DataParallel

    rank, world, make_comm = join("dp")
    cfg = PRESETS[args.model]
    x, y = global_batch(0, 0, args.batch, cfg.seq_len, cfg.vocab_size)
    x, y = shard_rows(x, rank, world), shard_rows(y, rank, world)
    comm = make_comm(args.trace)

    z1_model = GPT(cfg, seed=0)
    z1 = ZeroDataParallel(z1_model, comm, stage=1, bucket_mb=args.bucket_mb)
    z1_update = ShardedAdamWUpdater(
        z1.shards,
        comm,
        lr=1e-4,
        hyper=AdamHyper(),
        facts=z1.shard_facts,
        after_step=z1.gather_params,
    )
    z3_model = GPT(cfg, seed=0)
    z3 = Zero3DataParallel(z3_model.units(), comm)
    z3_update = ShardedAdamWUpdater(
        z3.shards, comm, lr=1e-4, hyper=AdamHyper(), facts=z3.shard_facts
    )

    ddp = DDP(GPT(cfg, seed=0), bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True)
    zro = ZeroRedundancyOptimizer(
        ddp.parameters(),
        optimizer_class=torch.optim.AdamW,
        lr=1e-4,
        foreach=False,
        weight_decay=0.0,
    )
    fsdp_model = GPT(cfg, seed=0)
    mesh = init_device_mesh("cpu", (world,))
    for block in fsdp_model.blocks.values():
        fully_shard(block, mesh=mesh)
    fully_shard(fsdp_model, mesh=mesh)
    fsdp_opt = torch.optim.AdamW(fsdp_model.parameters(), lr=1e-4, foreach=False, weight_decay=0.0)

    def ours(model, sync, updater):
        def step() -> None:
            loss = model(x, y)
            loss.backward()
            sync.wait()
            updater.step(1e-4, None)
            sync.zero_grad()
            return loss.detach()

        return step

    def torch_zero1():
        loss = ddp(x, y)
        loss.backward()
        zro.step()
        zro.zero_grad(set_to_none=False)
        return loss.detach()

    def torch_fsdp2():
        loss = fsdp_model(x, y)
        loss.backward()
        fsdp_opt.step()
        fsdp_opt.zero_grad()
        return loss.detach()

    if rank == 0:
        print(
            "\nworkbench ZeRO vs torch — same model (seed 0), same batch, AdamW without weight decay",
            flush=True,
        )
    # a reduce-scatter sums in another order than DDP's all-reduce: ~1 ulp of the loss
    check_same_losses(
        ("ours ZeRO-1", ours(z1_model, z1, z1_update)), ("ZeroRedundancyOptimizer", torch_zero1)
    )
    check_same_losses(("ours ZeRO-3", ours(z3_model, z3, z3_update)), ("FSDP2", torch_fsdp2))
    candidates = {
        "ours ZeRO-1": ours(z1_model, z1, z1_update),
        "ZeroRedundancyOptimizer": torch_zero1,
        "ours ZeRO-3": ours(z3_model, z3, z3_update),
        "FSDP2": torch_fsdp2,
    }
    med = interleaved_rounds(candidates, args.rounds, args.warmup)
    if rank == 0:
        print(
            f"\nworkbench ZeRO vs torch — model {args.model}, {world} ranks, global batch {args.batch}, "
            f"{args.rounds} rounds interleaved (torch {torch.__version__}, gloo)"
        )
        for ours_name, ref in (
            ("ours ZeRO-1", "ZeroRedundancyOptimizer"),
            ("ours ZeRO-3", "FSDP2"),
        ):
            print(
                f"  {ours_name:<12} {med[ours_name] * 1e3:8.2f} ms   {ref:<24} {med[ref] * 1e3:8.2f} ms"
            )
            print("    " + report(f"ratio {ours_name}/{ref}", med.ratio(ours_name, ref)))
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker))
