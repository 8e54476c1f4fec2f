"""Our bucketed data parallelism against torch DDP, in one invocation, runs interleaved.

    python benchmarks/dp_vs_ddp.py                 # 2 ranks, `small` model, 4 MB buckets
    python benchmarks/dp_vs_ddp.py --ranks 4 --bucket-mb 25 --rounds 60
    python benchmarks/dp_vs_ddp.py --repeat 3              # the whole comparison three times: the spread
    python benchmarks/dp_vs_ddp.py --backend nccl --ranks 8 --model gpt2-small --global-batch 16   # GPUs

Prints, on rank 0:
1. median step time (forward + backward + gradient sync + AdamW) of ours and of DDP on the same
   model, batch and bucket size, alternating step by step so that both see the same machine noise,
   and the ratio ours / DDP with its 95 % interval over the rounds and the minimum-based ratio;
2. the cost of tracing: ours with the recorder on against off (ratio);
3. bus bandwidth of our send/recv ring against the backend's all-reduce at several sizes.

Run it directly: it starts itself under torchrun (free port, one thread per rank). Ratios are what
count on a shared machine; absolute times are printed for context.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from harness import (
    check_same_losses,
    common_arguments,
    entry,
    interleaved_rounds,
    join,
    rank_device,
    report,
)


def worker(args: argparse.Namespace) -> None:

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.comm.ring_allreduce import ring_all_reduce
    from workbench.config import PRESETS
    from workbench.data.synthetic import global_batch, shard_rows
    from workbench.model.gpt import GPT
    from workbench.parallel.data_parallel import BucketedDataParallel
    from workbench.trace.bandwidth import bus_factor

    rank, world, make_comm = join("dp", args.backend)
    cfg = PRESETS[args.model]
    device = rank_device()

    def make(trace: bool):
        model = GPT(cfg, seed=0).to(device)
        comm = make_comm(trace)
        sync = BucketedDataParallel(model, comm, bucket_mb=args.bucket_mb)
        return model, sync, torch.optim.AdamW(model.parameters(), lr=1e-4)

    ours, ours_sync, ours_opt = make(trace=True)
    quiet, quiet_sync, quiet_opt = make(trace=False)
    ddp_model = GPT(cfg, seed=0).to(device)
    ddp = DDP(
        ddp_model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=args.bucket_mb,
        gradient_as_bucket_view=True,
        broadcast_buffers=False,
    )
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

    x, y = global_batch(0, 0, args.global_batch, cfg.seq_len, cfg.vocab_size)
    x, y = shard_rows(x, rank, world).to(device), shard_rows(y, rank, world).to(device)

    def step_ours(model, sync, opt):
        sync.comm.start_step(0)
        loss = model(x, y)
        loss.backward()
        sync.wait()
        opt.step()
        sync.zero_grad()
        sync.comm.end_step()  # CUDA: the step's device records written
        return loss.detach()

    def step_ddp():
        loss = ddp(x, y)
        loss.backward()
        ddp_opt.step()
        ddp_opt.zero_grad(set_to_none=False)
        return loss.detach()

    if rank == 0:
        print(
            "\nworkbench DP vs torch DDP — same model (seed 0), same batch, same AdamW", flush=True
        )
    # gradients averaged in another order (divide then sum, against DDP's sum then divide): ~1 ulp
    check_same_losses(
        ("ours", lambda: step_ours(ours, ours_sync, ours_opt)), ("DDP", step_ddp), rtol=1e-5
    )
    candidates = {
        "ours": lambda: step_ours(ours, ours_sync, ours_opt),
        "ddp": step_ddp,
        "ours_untraced": lambda: step_ours(quiet, quiet_sync, quiet_opt),
    }
    med = interleaved_rounds(candidates, args.rounds, args.warmup)

    # ring vs backend all-reduce bandwidth
    comm = make_comm(False)
    bw_rows = []
    for numel in (2**10, 2**14, 2**18, 2**21):
        buf = torch.randn(numel, device=device)
        row = {}
        for algo in ("backend", "ring"):
            ts = []
            for _ in range(args.bw_repeats):
                dist.barrier()
                t = time.perf_counter()
                if algo == "ring":
                    ring_all_reduce(comm, buf, "dp")
                else:
                    comm.all_reduce(buf, "dp")
                if device.type == "cuda":
                    torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
            comm.end_step()
            t_med = torch.tensor([statistics.median(ts)], device=device)
            dist.all_reduce(t_med, op=dist.ReduceOp.MAX)
            row[algo] = numel * 4 / t_med.item() / 1e9 * bus_factor("all_reduce", world)
        bw_rows.append((numel * 4, row))

    if rank == 0:
        n_params = sum(p.numel() for p in ours.parameters())
        print(
            f"\nworkbench DP vs torch DDP — model {args.model} ({n_params / 1e6:.2f} M params), {world} ranks, "
            f"global batch {args.global_batch}, buckets {args.bucket_mb} MB, {args.rounds} rounds interleaved "
            f"(torch {torch.__version__}, {args.backend})"
        )
        print(f"  median step   ours {med['ours'] * 1e3:8.2f} ms   DDP {med['ddp'] * 1e3:8.2f} ms")
        print("  " + report("ratio ours/DDP", med.ratio("ours", "ddp")))
        print(
            f"  tracing       on {med['ours'] * 1e3:8.2f} ms   off {med['ours_untraced'] * 1e3:8.2f} ms"
        )
        print("  " + report("tracing overhead on/off", med.ratio("ours", "ours_untraced")))
        print("  all-reduce bus bandwidth (GB/s, median):")
        print(f"  {'bytes':>10} {'backend':>10} {'ring (ours)':>12} {'ring/backend':>13}")
        for nbytes, row in bw_rows:
            print(
                f"  {nbytes:>10} {row['backend']:>10.3f} {row['ring']:>12.3f} {row['ring'] / row['backend']:>13.3f}"
            )
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    p.add_argument("--bw-repeats", type=int, default=10)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker))
