"""What every benchmark shares: it starts itself under torchrun, times candidates interleaved (so
they see the same machine noise), and reports each ratio with a 95 % bootstrap interval over the
rounds and the minimum-based ratio beside the median (workbench/analysis/intervals.py). `--repeat K`
reruns the whole comparison K times and prints each ratio's spread over the K runs."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def self_launch(script: str, ranks: int) -> int:
    """Run `script` on `ranks` processes (torchrun's free port, one thread per rank); its argv travels
    in WB_BENCH_ARGS."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WB_BENCH_ARGS": " ".join(sys.argv[1:])}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        os.path.abspath(script),
    ]
    return subprocess.call(cmd, env=env)


def common_arguments(doc: str | None, **defaults: object) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, default=defaults.get("ranks", 2))
    p.add_argument("--model", default=defaults.get("model", "small"))
    p.add_argument(
        "--rounds",
        type=int,
        default=defaults.get("rounds", 40),
        help="interleaved rounds; the ratios' intervals are bootstrapped over them (≥ 40)",
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="rerun the whole comparison K times; print the spread"
    )
    p.add_argument("--warmup", type=int, default=defaults.get("warmup", 3))
    p.add_argument("--trace", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--backend",
        default=defaults.get("backend", "gloo"),
        choices=("gloo", "nccl"),
        help="nccl: one GPU per rank (timing synchronises the device)",
    )
    return p


class Timings:
    """Per candidate, the slowest rank's time in each timed round (rounds paired across candidates)."""

    def __init__(self, rounds: dict[str, list[float]]) -> None:
        self.rounds = rounds

    def __getitem__(self, name: str) -> float:
        return statistics.median(self.rounds[name])

    def ratio(self, a: str, b: str) -> object:
        from workbench.analysis.intervals import ratio

        return ratio(self.rounds[a], self.rounds[b])


def interleaved_rounds(
    candidates: dict[str, Callable[[], None]], rounds: int, warmup: int
) -> Timings:
    """Each round runs every candidate once (order reversed every other round, a barrier before each);
    a round's time is the slowest rank's. `timings[name]` is the median, `timings.ratio(a, b)` a/b
    with its interval."""
    import torch
    import torch.distributed as dist

    times: dict[str, list[float]] = {k: [] for k in candidates}
    sync = torch.cuda.synchronize if dist.get_backend() == "nccl" else (lambda: None)
    for i in range(rounds + warmup):
        for name in list(candidates) if i % 2 == 0 else list(reversed(candidates)):
            dist.barrier()
            sync()
            t = time.perf_counter()
            candidates[name]()
            sync()
            if i >= warmup:
                times[name].append(time.perf_counter() - t)
    out = {}
    for name, ts in times.items():
        slowest = torch.tensor(ts, dtype=torch.float64, device=rank_device())
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[name] = slowest.cpu().tolist()
    return Timings(out)


def report(label: str, value: object) -> str:
    """A ratio's line (label and its interval); kept for --repeat's spread when WB_BENCH_RESULTS is set."""
    path = os.environ.get("WB_BENCH_RESULTS")
    if path and int(os.environ.get("RANK", 0)) == 0:
        with open(path, "a") as f:
            f.write(json.dumps({"label": label, "value": getattr(value, "median", value)}) + "\n")
    return f"{label} = {value}"


def entry(
    script: str,
    parse: Callable[[list[str]], argparse.Namespace],
    worker: Callable[[argparse.Namespace], None],
    after: Callable[[argparse.Namespace], None] | None = None,
) -> int:
    """The benchmark's main: under torchrun run the worker, else start torchrun (then `after`)."""
    if "RANK" in os.environ:
        worker(parse(os.environ.get("WB_BENCH_ARGS", "").split()))
        return 0
    args = parse(sys.argv[1:])
    results: dict[str, list[float]] = {}
    for k in range(max(1, args.repeat)):
        if args.repeat > 1:
            print(f"\n=== run {k + 1} of {args.repeat} ===", flush=True)
        os.makedirs("traces", exist_ok=True)  # a run's scratch file, under traces/ (git-ignored)
        path = os.path.abspath(os.path.join("traces", f".bench_results_{os.getpid()}_{k}.jsonl"))
        os.environ["WB_BENCH_RESULTS"] = path
        rc = self_launch(script, args.ranks)
        if rc == 0 and after is not None:
            after(args)
        if rc != 0:
            return rc
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    r = json.loads(line)
                    results.setdefault(r["label"], []).append(r["value"])
            os.remove(path)
    if args.repeat > 1:
        from workbench.analysis.intervals import spread

        print(f"\nspread of each ratio over {args.repeat} whole runs:")
        for label, values in results.items():
            print(f"  {label:<40} {spread(values)}")
    return 0


def rank_device() -> object:
    """This rank's device: its GPU under NCCL (LOCAL_RANK), else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def join(axis: str, backend: str = "gloo") -> tuple[int, int, Callable[[bool], object]]:
    """Join the world (one thread per rank, 120 s timeout; NCCL: one GPU per rank) as a one-axis grid along
    `axis`; returns (rank, world, make_comm) where make_comm(trace) builds a traced Communicator on it
    (device-timed on CUDA, as a run's)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from workbench.comm.device_timing import DeviceClock, enable_nccl_timing
    from workbench.comm.groups import ProcessGroups
    from workbench.comm.traced import Communicator
    from workbench.config.grid import RankGrid
    from workbench.trace.recorder import TraceRecorder

    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        enable_nccl_timing()
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    grid = RankGrid(**{axis: world})
    groups = ProcessGroups.create(grid, rank, 120)
    device = rank_device()

    def make_comm(trace: bool) -> Communicator:
        rec = TraceRecorder(
            rank=rank,
            world_size=world,
            backend=backend,
            coords=grid.coords(rank),
            run_name="bench",
            enabled=trace,
        )
        clock = DeviceClock(rec.now_us) if backend == "nccl" else None
        return Communicator(groups, rec, clock=clock, device=device, timeout_s=120)

    return rank, world, make_comm


def check_same_losses(
    ours: tuple[str, Callable[[], object]],
    ref: tuple[str, Callable[[], object]],
    steps: int = 3,
    rtol: float = 1e-5,
    reduce: str = "mean",
) -> None:
    """Before any timing: both sides train `steps` steps (each callable runs one and returns this rank's
    loss) from the same model on the same batch; the global loss (`reduce`: the mean of the ranks'
    losses, or their sum when only one rank holds it) must agree within rtol · loss at every step.
    Prints the check on rank 0, and stops the benchmark if it fails: a ratio between two programs that
    compute different things means nothing."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    history = []
    for _ in range(steps):
        pair = torch.tensor(
            [float(ours[1]()), float(ref[1]())], dtype=torch.float64, device=rank_device()
        )
        dist.all_reduce(pair)
        history.append(pair / world if reduce == "mean" else pair)
    history = [h.cpu() for h in history]
    worst = max(abs(a - b).item() / abs(b).item() for a, b in history)
    if dist.get_rank() == 0:
        print(
            f"  check  {ours[0]} vs {ref[0]}: losses {history[0][0]:.6f} → {history[-1][0]:.6f} over {steps} "
            f"steps, max relative difference {worst:.1e} (tolerance {rtol:g})",
            flush=True,
        )
    if worst > rtol:
        raise SystemExit(
            f"{ours[0]} and {ref[0]} do not compute the same losses (max relative difference "
            f"{worst:.2e} > {rtol:g}): fix the comparison before timing it"
        )
