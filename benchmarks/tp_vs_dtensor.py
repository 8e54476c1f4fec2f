"""Our tensor parallelism against PyTorch's DTensor tensor parallelism, in one invocation, interleaved.

    python benchmarks/tp_vs_dtensor.py                      # 2 ranks, `small` model
    python benchmarks/tp_vs_dtensor.py --ranks 4 --rounds 60

The same GPT, the same batch, the same t. PyTorch's side is `parallelize_module` with
ColwiseParallel on qkv and fc, RowwiseParallel on the projections, RowwiseParallel on the embedding
and ColwiseParallel (logits gathered) on the head — torchtitan's plan without loss_parallel. Ours is
workbench's Megatron-style layers with the vocabulary-parallel loss. Each round runs one training step
(forward, backward, AdamW) of each, alternating the order; rank 0 prints the medians and
the ratio with its 95 % interval.
"""

from __future__ import annotations

import argparse
import sys

from harness import check_same_losses, common_arguments, entry, interleaved_rounds, join, report


def worker(args: argparse.Namespace) -> None:

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    from workbench.config import PRESETS
    from workbench.data.synthetic import global_batch
    from workbench.model.gpt import GPT
    from workbench.parallel.param_facts import ParamTable
    from workbench.parallel.tensor_parallel import TensorParallelGrads, apply_tensor_parallel
    from workbench.parallel.tp_communications import TPContext

    rank, world, make_comm = join("tp")
    cfg = PRESETS[args.model]
    x, y = global_batch(0, 0, args.batch, cfg.seq_len, cfg.vocab_size)

    comm = make_comm(args.trace)
    tp = TPContext(comm=comm, rank=rank, size=world, sequence_parallel=False)
    ours = apply_tensor_parallel(GPT(cfg, seed=0), tp)
    ours.init_weights(0)  # the shards, cut from each parameter's full initial value
    # no sequence parallelism: none partial
    ours_grads = TensorParallelGrads(ours, tp, facts=ParamTable.plain(ours.parameters()))
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=1e-4, foreach=False)

    mesh = init_device_mesh("cpu", (world,))
    ref = GPT(cfg, seed=0)
    heads_first(ref, world)
    # logits stay split by vocabulary: loss_parallel
    plan = {
        "wte": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(use_local_output=False),
    }
    for i in range(cfg.layers):
        plan.update(
            {
                f"blocks.{i}.attn.qkv": ColwiseParallel(),
                f"blocks.{i}.attn.proj": RowwiseParallel(),
                f"blocks.{i}.mlp.fc": ColwiseParallel(),
                f"blocks.{i}.mlp.proj": RowwiseParallel(),
            }
        )
    parallelize_module(ref, mesh, plan)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-4, foreach=False)

    def step_ours():
        loss = ours(x, y)
        loss.backward()
        ours_grads.wait()
        ours_opt.step()
        ours_opt.zero_grad()
        return loss.detach()

    def step_ref():
        # the cross-entropy of vocabulary-split logits, never gathered (like ours)
        with loss_parallel():
            loss = ref(x, y)
            loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        return loss.detach().full_tensor() if hasattr(loss, "full_tensor") else loss.detach()

    if rank == 0:
        print(
            "\nworkbench TP vs DTensor TP — same model (seed 0), q/k/v split by heads and the vocabulary-"
            "parallel loss on both sides",
            flush=True,
        )
    # the same shards; the row-parallel sums and the loss's all-reduces add in another order: a few ulps
    # every tp rank holds the loss
    check_same_losses(("ours", step_ours), ("DTensor", step_ref), rtol=1e-5)

    med = interleaved_rounds({"ours": step_ours, "dtensor": step_ref}, args.rounds, args.warmup)
    if rank == 0:
        print(
            f"\nworkbench TP vs DTensor TP — model {args.model}, tp={world}, batch {args.batch}, "
            f"{args.rounds} rounds interleaved, tracing {'on' if args.trace else 'off'} "
            f"(torch {torch.__version__}, gloo)"
        )
        print(
            f"  median step   ours {med['ours'] * 1e3:8.2f} ms   DTensor {med['dtensor'] * 1e3:8.2f} ms"
        )
        print("  " + report("ratio ours/DTensor", med.ratio("ours", "dtensor")))
    dist.barrier()
    dist.destroy_process_group()


def heads_first(model, t: int) -> None:
    """Reorder each fused qkv projection's rows from [q | k | v] to [q_0 k_0 v_0 | q_1 k_1 v_1 | …] (j: the
    heads of tp rank j), so that ColwiseParallel's contiguous shards are our q, k, v split by heads; the
    attention of a rank then sees its own heads' q, k and v, as in Megatron."""
    import torch

    for block in model.blocks.values():
        lin = block.attn.qkv
        h = lin.out_features // 3
        order = torch.arange(3 * h).view(3, t, h // t).transpose(0, 1).reshape(-1)
        with torch.no_grad():
            lin.weight.copy_(lin.weight[order])
            lin.bias.copy_(lin.bias[order])


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--batch", type=int, default=8)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker))
