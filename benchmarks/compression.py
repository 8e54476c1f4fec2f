"""Gradient compression, ours against torch DDP's compress hook, and 1-bit Adam's bytes, in one invocation.

    python benchmarks/compression.py                 # 2 ranks, `small` model, 4 MB buckets
    python benchmarks/compression.py --ranks 4 --rounds 60

Prints, on rank 0:
1. the check: ours with bf16 buckets and DDP with `bf16_compress_hook` train the same losses (same model,
   seed, batch, buckets, AdamW);
2. bytes on the wire per step (from our traced collectives) and median step time: ours-bf16 / ours-fp32,
   and ours-bf16 / DDP-bf16 (the target is ≤ 1.00), steps interleaved so all see the same noise;
3. 1-bit Adam's compressed momentum all-reduce (optim/onebit_adam.py) on the model's Ψ values: the bytes
   each rank sends against the fp32 all-reduce's (the ratio is ≈ 1/32, plus the scales).

It starts itself under torchrun (free port, one thread per rank). Ratios are what count on a shared machine.
"""

from __future__ import annotations

import argparse
import sys

from harness import check_same_losses, common_arguments, entry, interleaved_rounds, join, report


def _sent(comm) -> float:
    """Bytes this rank sent in the collectives its communicator recorded (then forgets them)."""
    from workbench.trace.bandwidth import bytes_sent
    from workbench.trace.spans import comm_intervals

    sent = sum(bytes_sent(a) for a, _, _ in comm_intervals(comm.recorder.events))
    comm.recorder.events.clear()
    return sent


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workbench.config import PRESETS
    from workbench.data.synthetic import global_batch, shard_rows
    from workbench.model.gpt import GPT
    from workbench.optim.onebit_adam import CompressedAllReduce
    from workbench.parallel.data_parallel import BucketedDataParallel

    rank, world, make_comm = join("dp")
    cfg = PRESETS[args.model]
    x, y = global_batch(0, 0, args.global_batch, cfg.seq_len, cfg.vocab_size)
    x, y = shard_rows(x, rank, world), shard_rows(y, rank, world)

    def ours(compression):
        model, comm = GPT(cfg, seed=0), make_comm(True)
        sync = BucketedDataParallel(model, comm, bucket_mb=args.bucket_mb, compression=compression)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            loss = model(x, y)
            loss.backward()
            sync.wait()
            opt.step()
            sync.zero_grad()
            return loss.detach()

        return step, comm

    ddp = DDP(
        GPT(cfg, seed=0),
        bucket_cap_mb=args.bucket_mb,
        gradient_as_bucket_view=True,
        broadcast_buffers=False,
    )
    # DDP refuses its bf16 hook off CUDA by the hook's name; gloo reduces bf16 fine: the same function
    # runs under another name (tests/test_compression.py does the same)
    ddp.register_comm_hook(None, lambda state, bucket: bf16_compress_hook(state, bucket))
    ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

    def step_ddp():
        loss = ddp(x, y)
        loss.backward()
        ddp_opt.step()
        ddp_opt.zero_grad(set_to_none=False)
        return loss.detach()

    bf16, bf16_comm = ours(torch.bfloat16)
    fp32, fp32_comm = ours(None)
    if rank == 0:
        print(
            f"\ngradient compression — model {args.model}, {world} ranks, buckets {args.bucket_mb} MB",
            flush=True,
        )
    # both cast to bf16, divide there and sum: the same arithmetic; bf16 rounding in another order at most
    check_same_losses(("ours-bf16", bf16), ("DDP-bf16-hook", step_ddp), rtol=1e-5)
    _sent(bf16_comm), _sent(fp32_comm)
    bf16(), fp32()
    wire = {"bf16": _sent(bf16_comm), "fp32": _sent(fp32_comm)}
    med = interleaved_rounds(
        {"ours_bf16": bf16, "ours_fp32": fp32, "ddp_bf16": step_ddp}, args.rounds, args.warmup
    )

    n = sum(p.numel() for p in GPT(cfg, seed=0).parameters())
    padded = -(-n // (8 * world)) * 8 * world
    comm = make_comm(True)
    CompressedAllReduce(comm, padded, torch.device("cpu"))(torch.randn(padded))
    onebit = _sent(comm)
    comm.all_reduce(torch.randn(n), "dp")
    full = _sent(comm)
    if rank == 0:
        print(
            f"  bytes sent per step    ours-bf16 {wire['bf16']:,.0f}   ours-fp32 {wire['fp32']:,.0f}   "
            f"ratio bf16/fp32 = {wire['bf16'] / wire['fp32']:.3f}"
        )
        print(
            f"  median step            ours-bf16 {med['ours_bf16'] * 1e3:.2f} ms   ours-fp32 "
            f"{med['ours_fp32'] * 1e3:.2f} ms   DDP-bf16 {med['ddp_bf16'] * 1e3:.2f} ms"
        )
        print("  " + report("ratio ours-bf16 / ours-fp32", med.ratio("ours_bf16", "ours_fp32")))
        print(
            "  "
            + report("ratio ours-bf16 / DDP-bf16", med.ratio("ours_bf16", "ddp_bf16"))
            + "  (target ≤ 1.00)"
        )
        print(
            f"  1-bit Adam momentum    {onebit:,.0f} bytes against the fp32 all-reduce's {full:,.0f}: "
            f"ratio = {onebit / full:.4f} (1/32 = {1 / 32:.4f})"
        )
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--bucket-mb", type=float, default=4.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker))
