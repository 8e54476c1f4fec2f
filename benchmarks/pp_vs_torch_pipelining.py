"""Our 1F1B against torch.distributed.pipelining's Schedule1F1B, same stages and microbatches,
interleaved in one invocation.

    python benchmarks/pp_vs_torch_pipelining.py                    # 2 stages, `small`, m = 4
    python benchmarks/pp_vs_torch_pipelining.py --ranks 4 --microbatches 8
    python benchmarks/pp_vs_torch_pipelining.py --bubble           # also: measured bubble vs formula, m ∈ {2, 4, 8}

Both sides use the same GPT stages (workbench.pipeline.stages), the same batch cut into the same
microbatches, and AdamW; each round runs one training step of each, alternating the order. Rank 0
prints the median step times and the ratio ours / torch (with its 95 % interval). With --bubble it
then launches our 1F1B runs for m ∈ {2, 4, 8} and prints the measured bubble beside (p − 1)/(m + p − 1).
"""

from __future__ import annotations

import argparse
import os
import sys

from harness import check_same_losses, common_arguments, entry, interleaved_rounds, join, report


def bubble_table(args: argparse.Namespace, tolerance: float = 0.12) -> None:
    import tempfile

    import workbench as wb

    print(f"\nmeasured bubble of our 1F1B, p={args.ranks}, model {args.model}, global batch {args.batch} "
          f"(tolerance: measured − formula in [−0.02, {tolerance}], see the note below)")
    print(f"  {'m':>3} {'measured':>9} {'formula':>8} {'difference':>11}  within")
    with tempfile.TemporaryDirectory() as d:
        for m in (2, 4, 8):
            run = wb.launch(wb.RunConfig(model=args.model, pp=args.ranks, microbatches=m, global_batch=args.batch,
                                         steps=6), out=os.path.join(d, f"m{m}"), progress=False)
            b = run.summary["bubble_fraction"]
            diff = b["measured"] - b["predicted"]
            print(f"  {m:>3} {b['measured']:>9.3f} {b['predicted']:>8.3f} {diff:>+11.3f}  {-0.02 <= diff <= tolerance}")
    print("  The formula assumes equal stage times and free communication; on CPU each microbatch boundary\n"
          "  adds a gloo send/receive (~1 ms) to the critical path, so the excess grows with m.")


def worker(args: argparse.Namespace) -> None:

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from workbench.config import PRESETS
    from workbench.engine.data import global_batch
    from workbench.engine.model import GPT
    from workbench.measure.memory import MemoryTracker
    from workbench.pipeline.executor import PipelineExecutor
    from workbench.pipeline.schedule import build_schedule
    from workbench.pipeline.stages import build_stages

    rank, world, make_comm = join("pp")
    cfg = PRESETS[args.model]
    m = args.microbatches
    x, y = global_batch(0, 0, args.batch, cfg.seq_len, cfg.vocab_size)
    device = torch.device("cpu")

    comm = make_comm(args.trace)
    rec = comm.recorder
    schedule = build_schedule("1f1b", world, m)

    def stage(layers: range, first: bool, last: bool) -> GPT:
        return GPT(cfg, seed=0, layers=layers, first=first, last=last)

    ours_chunks = build_stages(cfg.layers, schedule, rank, stage)
    executor = PipelineExecutor(schedule, rank, ours_chunks, comm, MemoryTracker(rec, device),
                                (args.batch // m, cfg.seq_len, cfg.hidden), device)
    ours_params = [p for c in ours_chunks.values() for p in c.parameters()]
    ours_opt = torch.optim.AdamW(ours_params, lr=1e-4, foreach=False)

    ref_module = build_stages(cfg.layers, schedule, rank, stage)[rank]
    ref_stage = PipelineStage(ref_module, rank, world, device)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    ref_schedule = Schedule1F1B(ref_stage, m, loss_fn=loss_fn)
    ref_opt = torch.optim.AdamW(ref_module.parameters(), lr=1e-4, foreach=False)

    def step_ours():  # noqa: ANN202
        loss = executor.run(x, y, 0)  # the mean over microbatches on the last stage, 0 elsewhere
        ours_opt.step()
        ours_opt.zero_grad()
        return loss

    def step_ref():  # noqa: ANN202
        losses: list[torch.Tensor] = []
        if rank == 0:
            ref_schedule.step(x)
        elif rank == world - 1:
            ref_schedule.step(target=y, losses=losses)
        else:
            ref_schedule.step()
        ref_opt.step()
        ref_opt.zero_grad()
        return torch.stack(losses).mean().detach() if losses else torch.zeros(())

    if rank == 0:
        print("\nworkbench 1F1B vs Schedule1F1B — same stages (seed 0), same batch and microbatches", flush=True)
    # the same arithmetic per microbatch; the gradient sums the microbatches in the same order
    check_same_losses(("ours", step_ours), ("Schedule1F1B", step_ref), reduce="sum")
    med = interleaved_rounds({"ours": step_ours, "torch": step_ref}, args.rounds, args.warmup)
    if rank == 0:
        print(f"\nworkbench 1F1B vs torch.distributed.pipelining Schedule1F1B — model {args.model}, p={world}, "
              f"m={m}, batch {args.batch}, {args.rounds} rounds interleaved (torch {torch.__version__}, gloo)")
        print(f"  median step   ours {med['ours'] * 1e3:8.2f} ms   torch {med['torch'] * 1e3:8.2f} ms")
        print("  " + report("ratio ours/torch", med.ratio("ours", "torch")))
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--bubble", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker, after=lambda a: bubble_table(a) if a.bubble else None))
