"""Our pipeline schedules against torch.distributed.pipelining's, same stages and microbatches,
interleaved in one invocation.

    python benchmarks/pp_vs_torch_pipelining.py                    # 1F1B, 2 stages, `small`, m = 4
    python benchmarks/pp_vs_torch_pipelining.py --schedule zbh1     # ZB-H1: ours vs torch's runtime on our CSV
    python benchmarks/pp_vs_torch_pipelining.py --schedule zbv      # ZBV: ours vs torch's ScheduleZBVZeroBubble
    python benchmarks/pp_vs_torch_pipelining.py --schedule dualpipev   # ours vs torch's ScheduleDualPipeV
    python benchmarks/pp_vs_torch_pipelining.py --schedule dualpipev --reference csv  # vs torch's runtime on our CSV
    python benchmarks/pp_vs_torch_pipelining.py --ranks 4 --microbatches 8
    python benchmarks/pp_vs_torch_pipelining.py --bubble           # also: measured bubbles vs formula and simulation

The reference for each schedule (`--reference torch`, the default): 1F1B → torch's Schedule1F1B; ZB-H1 →
torch's `_PipelineScheduleRuntime` running our ZB-H1 exported as its CSV (torch's
ScheduleInterleavedZeroBubble needs two stages per rank, another sharding); ZBV → torch's
ScheduleZBVZeroBubble and DualPipeV → torch's ScheduleDualPipeV (the same V of stages: rank r holds
stages r and 2p − 1 − r; both need m ≥ 2p, so m defaults to 4, or 2p where that is more). With
`--reference csv` the reference is torch's `_PipelineScheduleRuntime` running our schedule exported as
its compute-only CSV (F&B pairs as its OVERLAP_F_B cells), which lowers it to sends and receives
itself: the same actions in the same order on both sides, two executors compared (for DualPipeV the
same as the default, whose order ours equals action for action: tests/test_dualpipe.py). DeepSeek's
bidirectional DualPipe (two copies of the model, micro-batches entering at both ends) has no reference
here: torch's runtime has one entry stage and one loss stage. Both sides use the same GPT stages
(workbench.pipeline.stages), the same batch cut into the same microbatches, and AdamW; the losses are
checked equal first, then each round runs one training step of each, alternating the order. Rank 0
prints the median step times and the ratio ours / torch (with its 95 % interval).

With --profile rank 0 also prints, per rank and side, the main thread's CPU time per step beside the
step: a ratio above 1 from more work, or from more time off the CPU (waiting for a transfer, the
schedule's idling, preemption on a busy machine). On zbv it also times our executor on torch's own ZBV
order (read from its CSV), its losses checked against ours first: the two runtimes on the same actions.

With --bubble it then launches our runs of 1F1B, ZB-H1, ZBV, DualPipeV and DualPipe (m = 8, the
`small` model unless --model says otherwise) and prints each measured bubble rate (idle between a
rank's first and last pass ÷ its work, the zero-bubble paper's measure) beside the formula's ((p − 1)/m,
(p − 1)/3m, 0 at equal pass times; for DualPipe(V) DeepSeek's idle time per rank (PP/2 − 1)(F&B + B −
3W) at those times over the rank's work) and the simulation with the run's measured costs, and each
measured bubble fraction beside the simulated one (the stated band: within 10 %).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from harness import check_same_losses, common_arguments, entry, interleaved_rounds, join, report

SCHEDULES = ("1f1b", "zbh1", "zbv", "dualpipev")
# torch's own generated schedule for ours, where it has one
OWN = {"1f1b": "Schedule1F1B", "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
BUBBLE_SCHEDULES = ("1f1b", "zbh1", "zbv", "dualpipev", "dualpipe")


def bubble_table(args: argparse.Namespace, band: float = 0.10) -> None:
    import tempfile

    import workbench as wb
    from workbench.config import PRESETS
    from workbench.schedules.build import build_schedule

    # ZBV's and DualPipe's 2p stages divide them
    layers = -(-PRESETS[args.model].layers // (2 * args.ranks)) * 2 * args.ranks
    model = {"base": args.model, "layers": layers}  # the same model for every schedule
    print(
        f"\nmeasured bubbles, p={args.ranks}, m=8, model {args.model} with {layers} layers, global batch "
        f"{args.batch}: the rate "
        f"(idle ÷ work) beside the formula and the simulation with measured costs; the fraction of the step "
        f"beside its simulation from every measured cost (compute per stage and kind, transfers, host gaps, "
        f"entry skew: summary.json's split less its unexplained rest; band: within {band:.0%})"
    )
    print(
        f"  {'schedule':<9} {'rate':>6} {'formula':>8} {'sim.':>6} │ {'fraction':>8} {'sim.':>6} {'within':>7}"
    )
    with tempfile.TemporaryDirectory() as d:
        for name in BUBBLE_SCHEDULES:
            try:
                build_schedule(name, args.ranks, 8)
            except ValueError as e:  # DualPipe: an even p only
                print(f"  {name:<9} not run: {e}")
                continue
            run = wb.launch(
                wb.RunConfig(
                    model=model,
                    pp=args.ranks,
                    microbatches=8,
                    global_batch=args.batch,
                    schedule=name,
                    steps=6,
                ),
                out=os.path.join(d, name),
                progress=False,
            )
            b = run.summary["bubble_fraction"]
            split = b["split"]
            sim = split["measured"] - split["unexplained"]
            within = abs(split["unexplained"]) <= band * sim
            print(
                f"  {name:<9} {b['measured_rate']:>6.3f} {b['formula_rate']:>8.3f} {b['simulated_rate']:>6.3f} │ "
                f"{split['measured']:>8.3f} {sim:>6.3f} {str(within):>7}"
            )
    print(
        "  The formula assumes equal pass times (T_F = T_I = T_W) and free transfers; the simulation takes\n"
        "  each kind of pass's measured mean and the measured transfer time. On a CPU, ranks beyond the\n"
        "  cores share them, and each microbatch boundary adds a gloo send/receive to the critical path.\n"
        "  DualPipe(V)'s formula is DeepSeek's idle per rank, (PP/2 − 1)(F&B + B − 3W) with PP = 2p for the\n"
        "  V and p for DualPipe, at F&B = F + B (one CPU thread overlaps nothing: the pairs' overlap cannot\n"
        "  be seen here), over the rank's work (summary.json's formula_rate: formulas.dualpipe_rate)."
    )


def torch_reference(
    args: argparse.Namespace, schedule: object, stages: list, loss_fn: object
) -> tuple[object, str]:
    """Torch's side (module docstring): its own generated schedule for ours, or (`--reference csv`,
    and ZB-H1 always) its `_PipelineScheduleRuntime` running our schedule from its CSV."""
    import torch.distributed as dist
    from torch.distributed.pipelining import Schedule1F1B
    from torch.distributed.pipelining.schedules import (
        ScheduleDualPipeV,
        ScheduleZBVZeroBubble,
        _PipelineScheduleRuntime,
    )

    from workbench.schedules.torch_csv import write_csv

    m = args.microbatches
    if args.reference == "torch" and args.schedule in OWN:
        cls = {"1f1b": Schedule1F1B, "zbv": ScheduleZBVZeroBubble, "dualpipev": ScheduleDualPipeV}
        first = stages[0] if args.schedule == "1f1b" else stages  # one stage per rank, else the V
        return cls[args.schedule](first, m, loss_fn=loss_fn), OWN[args.schedule]
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    path = os.path.abspath(f".wb_bench_{args.schedule}_{run_id}.csv")
    if dist.get_rank() == 0:
        write_csv(schedule, path)
    dist.barrier()
    runtime = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn)
    runtime._load_csv(path, format="compute_only")  # lowered to sends and receives by torch
    dist.barrier()
    if dist.get_rank() == 0:
        os.remove(path)
    return runtime, "torch runtime (our CSV)"


def kept(step: Callable[[], Any], out: list[Any]) -> Callable[[], Any]:
    """`step`, keeping what each call returns in `out`."""

    def keeping() -> Any:
        out.append(step())
        return out[-1]

    return keeping


def ours_on_torchs_order(
    ref: Any,
    *,
    stage: Callable[..., Any],
    comm: Any,
    layers: int,
    x: Any,
    y: Any,
    hidden: tuple,
    losses: list,
) -> Callable[[], Any]:
    """--profile on zbv: a training step of our executor (fresh stages, AdamW) on torch's own ZBV order —
    its compute actions written as CSV, read back with our transfers placed — so that the two runtimes
    are timed on the same actions, and the rest of ours/torch is the orders'. Its first steps' losses are
    checked against ours (`losses`, from the first check) before any timing."""
    import torch
    import torch.distributed as dist

    from workbench.measure.memory import MemoryTracker
    from workbench.pipeline.executor import PipelineExecutor
    from workbench.pipeline.stages import build_stages
    from workbench.schedules.torch_csv import read_csv

    rank, m = dist.get_rank(), ref._n_microbatches
    path = os.path.abspath(f".wb_bench_order_{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}.csv")
    if rank == 0:
        ref._dump_csv(path, format="compute_only")
    dist.barrier()
    schedule = read_csv(path, m)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    chunks = build_stages(layers, schedule, rank, stage)
    device = torch.device("cpu")
    executor = PipelineExecutor(
        schedule,
        rank,
        chunks,
        comm,
        recorder=comm.recorder,
        memory=MemoryTracker(comm.recorder, device),
        hidden_shape=hidden,
        device=device,
    )
    params = [p for c in chunks.values() for p in c.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=False)

    def step() -> Any:
        loss = executor.run(x, y, 0)
        opt.step()
        opt.zero_grad()
        return loss

    replay = iter(losses)
    check_same_losses(("ours on torch's order", step), ("ours", lambda: next(replay)), reduce="sum")
    return step


def on_cpu(step: Callable[[], object], times: list[float]) -> Callable[[], object]:
    """`step`, keeping the main thread's CPU time of each call in `times` (--profile)."""

    def timed() -> object:
        start = time.thread_time()
        out = step()
        times.append(time.thread_time() - start)
        return out

    return timed


def profile_table(med: Any, cpu: dict[str, list[float]], warmup: int) -> None:
    """--profile: per rank and side, the main thread's CPU time per step (median over the timed rounds)
    beside the step (the slowest rank's, median): what a side computes and what it spends off the CPU —
    waiting for a transfer, or preempted by another thread — so a ratio splits into work and idling."""
    import statistics

    import torch.distributed as dist

    mine = {name: statistics.median(ts[warmup:]) for name, ts in cpu.items()}
    every: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print("  profile: each rank's main thread, CPU time per step beside the step (median, ms)")
        for r, row in enumerate(every):
            cells = [
                f"{name} cpu {row[name] * 1e3:7.1f} off {(med[name] - row[name]) * 1e3:6.1f}"
                for name in row
            ]
            print(f"    rank {r}  " + "   ".join(cells))


def time_and_print(
    args: argparse.Namespace, candidates: dict[str, Callable[[], Any]], ref_name: str, world: int
) -> None:
    """The interleaved rounds, and rank 0's report: median steps, ours/torch (with --profile on zbv also our
    executor on torch's order / torch) and the --profile table."""
    import torch
    import torch.distributed as dist

    rank, m = dist.get_rank(), args.microbatches
    cpu: dict[str, list[float]] = {name: [] for name in candidates}
    if args.profile:
        candidates = {name: on_cpu(f, cpu[name]) for name, f in candidates.items()}
    med = interleaved_rounds(candidates, args.rounds, args.warmup)
    if rank == 0:
        print(
            f"\nworkbench {args.schedule} vs torch.distributed.pipelining {ref_name} — model {args.model}, "
            f"p={world}, m={m}, batch {args.batch}, {args.rounds} rounds interleaved "
            f"(torch {torch.__version__}, gloo)"
        )
        print(
            f"  median step   ours {med['ours'] * 1e3:8.2f} ms   torch {med['torch'] * 1e3:8.2f} ms"
        )
        print("  " + report("ratio ours/torch", med.ratio("ours", "torch")))
        if "ours on torch's order" in candidates:
            print(
                "  "
                + report(
                    "ours on torch's order / torch", med.ratio("ours on torch's order", "torch")
                )
            )
    if args.profile:
        profile_table(med, cpu, args.warmup)


def worker(args: argparse.Namespace) -> None:
    import dataclasses

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage

    from workbench.config import PRESETS
    from workbench.data.synthetic import global_batch
    from workbench.measure.memory import MemoryTracker
    from workbench.model.gpt import GPT
    from workbench.pipeline.executor import PipelineExecutor
    from workbench.pipeline.stages import build_stages
    from workbench.schedules.build import build_schedule

    rank, world, make_comm = join("pp")
    m = args.microbatches
    schedule = build_schedule(args.schedule, world, m)
    cfg = PRESETS[args.model]
    # the layers rounded up to a multiple of the stages (a V at p = 4: 8 stages of `small`'s 4 layers)
    cfg = dataclasses.replace(cfg, layers=-(-cfg.layers // schedule.stages) * schedule.stages)
    x, y = global_batch(0, 0, args.batch, cfg.seq_len, cfg.vocab_size)
    device = torch.device("cpu")

    comm = make_comm(args.trace)
    rec = comm.recorder

    def stage(layers: range, first: bool, last: bool) -> GPT:
        return GPT(cfg, seed=0, layers=layers, first=first, last=last)

    ours_chunks = build_stages(cfg.layers, schedule, rank, stage)
    executor = PipelineExecutor(
        schedule,
        rank,
        ours_chunks,
        comm,
        recorder=rec,
        memory=MemoryTracker(rec, device),
        hidden_shape=(args.batch // m, cfg.seq_len, cfg.hidden),
        device=device,
    )
    ours_params = [p for c in ours_chunks.values() for p in c.parameters()]
    ours_opt = torch.optim.AdamW(ours_params, lr=1e-4, foreach=False)

    ref_modules = build_stages(cfg.layers, schedule, rank, stage)
    ref_stages = [PipelineStage(c, k, schedule.stages, device) for k, c in ref_modules.items()]

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    ref_schedule, ref_name = torch_reference(args, schedule, ref_stages, loss_fn)
    ref_opt = torch.optim.AdamW(
        [p for c in ref_modules.values() for p in c.parameters()], lr=1e-4, foreach=False
    )
    first, last = schedule.rank_of(0), schedule.rank_of(schedule.stages - 1)

    def step_ours():
        loss = executor.run(x, y, 0)  # the mean over microbatches on the last stage, 0 elsewhere
        ours_opt.step()
        ours_opt.zero_grad()
        return loss

    def step_ref():
        losses: list[torch.Tensor] = []
        ref_schedule.step(
            *([x] if rank == first else []),
            **({"target": y, "losses": losses} if rank == last else {}),
        )
        ref_opt.step()
        ref_opt.zero_grad()
        return torch.stack(losses).mean().detach() if losses else torch.zeros(())

    if rank == 0:
        print(
            f"\nworkbench {args.schedule} vs {ref_name} — same stages (seed 0), same batch and microbatches",
            flush=True,
        )
    # the same arithmetic per microbatch; the gradient sums the microbatches (W: later, in the same sum)
    first_losses: list[torch.Tensor] = []
    check_same_losses(("ours", kept(step_ours, first_losses)), (ref_name, step_ref), reduce="sum")
    candidates = {"ours": step_ours, "torch": step_ref}
    if args.profile and args.schedule == "zbv":  # the two runtimes on the same actions
        candidates["ours on torch's order"] = ours_on_torchs_order(
            ref_schedule,
            stage=stage,
            comm=comm,
            layers=cfg.layers,
            x=x,
            y=y,
            hidden=executor.hidden_shape,
            losses=first_losses,
        )
    time_and_print(args, candidates, ref_name, world)
    dist.barrier()
    dist.destroy_process_group()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument(
        "--microbatches",
        type=int,
        default=None,
        help="default 4, or 2p for zbv and dualpipev where that is more (torch needs m ≥ 2p)",
    )
    p.add_argument("--schedule", default="1f1b", choices=SCHEDULES)
    p.add_argument(
        "--reference",
        default="torch",
        choices=("torch", "csv"),
        help="torch: torch's own schedule class (zbh1 has none: its runtime on our CSV); csv: torch's "
        "_PipelineScheduleRuntime running our schedule's CSV",
    )
    p.add_argument("--bubble", action="store_true")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also print each rank's CPU time per step beside the step, for both sides",
    )
    args = p.parse_args(argv)
    if args.microbatches is None:
        v_shaped = args.schedule in ("zbv", "dualpipev")
        args.microbatches = max(4, 2 * args.ranks) if v_shaped else 4
    problem = schedule_problem(args)
    if problem:
        p.error(problem)
    return args


def schedule_problem(args: argparse.Namespace) -> str | None:
    """What makes this schedule unrunnable here (before any process starts), or None."""
    from workbench.schedules.build import build_schedule

    try:
        build_schedule(args.schedule, args.ranks, args.microbatches)
    except ValueError as e:
        return f"--schedule {args.schedule} --ranks {args.ranks} --microbatches {args.microbatches}: {e}"
    if args.batch % args.microbatches:
        return f"--batch {args.batch} does not split into --microbatches {args.microbatches}"
    return None


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker, after=lambda a: bubble_table(a) if a.bubble else None))
