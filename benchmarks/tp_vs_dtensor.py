"""Our tensor parallelism against PyTorch's DTensor tensor parallelism, in one invocation, interleaved.

    python benchmarks/tp_vs_dtensor.py                      # 2 ranks, `small` model
    python benchmarks/tp_vs_dtensor.py --ranks 4 --rounds 30

The same GPT, the same batch, the same t. PyTorch's side is `parallelize_module` with
ColwiseParallel on qkv and fc, RowwiseParallel on the projections, RowwiseParallel on the embedding
and ColwiseParallel (logits gathered) on the head — torchtitan's plan without loss_parallel. Ours is
workbench's Megatron-style layers with the vocabulary-parallel loss. Each round runs one training step
(forward, backward, AdamW) of each, alternating the order; rank 0 prints the medians and the ratio.
"""

from __future__ import annotations

import argparse
import sys

from harness import common_arguments, entry, interleaved_medians, join


def worker(args: argparse.Namespace) -> None:

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from workbench.config import PRESETS
    from workbench.engine.data import global_batch
    from workbench.engine.model import GPT
    from workbench.parallel.tensor_parallel import TensorParallelGrads, apply_tensor_parallel
    from workbench.parallel.tp_communications import TPContext

    rank, world, make_comm = join("tp")
    cfg = PRESETS[args.model]
    x, y = global_batch(0, 0, args.batch, cfg.seq_len, cfg.vocab_size)

    comm = make_comm(args.trace)
    tp = TPContext(comm, rank, world, sequence_parallel=False)
    ours = apply_tensor_parallel(GPT(cfg, seed=0), tp)
    ours.init_weights(0)  # the shards, cut from each parameter's full initial value
    ours_grads = TensorParallelGrads(ours, tp)
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-4, foreach=False)

    mesh = init_device_mesh("cpu", (world,))
    ref = GPT(cfg, seed=0)
    plan = {"wte": RowwiseParallel(input_layouts=Replicate()),
            "head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(cfg.layers):
        plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(), f"blocks.{i}.attn.proj": RowwiseParallel(),
                     f"blocks.{i}.mlp.fc": ColwiseParallel(), f"blocks.{i}.mlp.proj": RowwiseParallel()})
    parallelize_module(ref, mesh, plan)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-4, foreach=False)

    def step_ours():
        loss = ours(x, y)
        loss.backward()
        ours_grads.wait()
        ours_opt.step()
        ours_opt.zero_grad()

    def step_ref():
        loss = ref(x, y)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()

    med = interleaved_medians({"ours": step_ours, "dtensor": step_ref}, args.rounds, args.warmup)
    if rank == 0:
        print(f"\nworkbench TP vs DTensor TP — model {args.model}, tp={world}, batch {args.batch}, "
              f"{args.rounds} rounds interleaved, tracing {'on' if args.trace else 'off'} "
              f"(torch {torch.__version__}, gloo)")
        print(f"  median step   ours {med['ours'] * 1e3:8.2f} ms   DTensor {med['dtensor'] * 1e3:8.2f} ms   "
              f"ratio ours/DTensor = {med['ours'] / med['dtensor']:.3f}")
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--batch", type=int, default=8)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker))
