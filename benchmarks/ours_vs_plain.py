"""Our engine against a plain PyTorch loop — the same GPT, the nanoGPT way — in one invocation, interleaved.

    python benchmarks/ours_vs_plain.py                          # CPU, one process, `small`, fp32
    python benchmarks/ours_vs_plain.py --rounds 60 --repeat 3   # the spread over three whole runs
    python benchmarks/ours_vs_plain.py --backend nccl --model gpt2-small --global-batch 16 --precision bf16 \\
        --attention sdpa [--compile]                            # one GPU: eager, or both sides compiled
    ... --model gpt-1.3b --global-batch 8 --compile --one-side-at-a-time   # ours timed and freed, then plain

Ours: the real engine — `parallelize` builds the Strategy, `train_step` runs it on a Batches source
(engine/batches.py), every step traced — once with fast steps (nothing measured) and once with every step
measured (memory by category, synchronised spans: measure/schedule.py). Plain: `GPT` from model/gpt.py
with `torch.optim.AdamW` (fused on CUDA, foreach on the CPU), `clip_grad_norm_`, autocast to bf16 on a GPU
(fp32 weights: nanoGPT's recipe, where ours keeps bf16 weights and fp32 masters), `torch.compile` of the
whole model with --compile (ours compiles each block), the next batch fetched while the forward runs, the
loss read every step, no hook. Both start from the same weights on the same batches (seed 0).

The losses are checked first: a ratio between programs that compute different things means nothing. The
tolerance: fp32 on the CPU 1e-5 relative (the same arithmetic but the gradient norm's order of summation:
~1e-7 of a step); bf16 on a GPU 3e-2 (plain computes in bf16 from fp32 weights under autocast, ours keeps
bf16 weights: the two round differently from the first matmul on, ~1e-2 after a few steps).

Prints on rank 0, for each of ours-fast and ours-measured, the median step time and the ratio to plain
with its 95 % bootstrap interval over the rounds (workbench/analysis/intervals.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from harness import (
    Timings,
    check_same_losses,
    common_arguments,
    entry,
    interleaved_rounds,
    rank_device,
    report,
)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from workbench.config import RunConfig
    from workbench.engine.batches import Batches
    from workbench.engine.context import setup
    from workbench.engine.parallelize import parallelize
    from workbench.engine.train_step import train_step
    from workbench.model.gpt import GPT

    torch.set_num_threads(1)
    cfg = RunConfig(
        model=args.model,
        global_batch=args.global_batch,
        steps=100_000,
        lr=args.lr,
        precision=args.precision,
        attention=args.attention,
        compile=args.compile,
        backend=args.backend,
        timeout_s=300,
    ).validate()
    ctx = setup(cfg, tempfile.mkdtemp(prefix="ours_vs_plain_"))
    device = rank_device()
    ours = parallelize(cfg, ctx)
    batches = Batches(cfg, device, dp_index=0, dp_size=1)
    step = {"ours": 0, "plain": 0}

    def run_ours(measured: bool) -> float:
        step["ours"] += 1
        return train_step(ours, batches, step["ours"], config=cfg, measured=measured).loss

    rtol = 1e-5 if cfg.precision == "fp32" else 3e-2
    # a model too large for both at once: ours timed and let go, then plain
    if args.one_side_at_a_time:
        first = [run_ours(False) for _ in range(3)]
        timed = interleaved_rounds(
            {"ours_fast": lambda: run_ours(False), "ours_measured": lambda: run_ours(True)},
            args.rounds,
            args.warmup,
        )
        del ours, run_ours
        free_device(device)
        plain_step = plain_loop(cfg, GPT, device, Batches(cfg, device, dp_index=0, dp_size=1), step)
        check_same_losses(("ours", lambda: first.pop(0)), ("plain", plain_step), rtol=rtol)
        med = Timings(
            {
                **timed.rounds,
                **interleaved_rounds({"plain": plain_step}, args.rounds, args.warmup).rounds,
            }
        )
    else:
        plain_step = plain_loop(cfg, GPT, device, Batches(cfg, device, dp_index=0, dp_size=1), step)
        check_same_losses(("ours", lambda: run_ours(False)), ("plain", plain_step), rtol=rtol)
        med = interleaved_rounds(
            {
                "ours_fast": lambda: run_ours(False),
                "ours_measured": lambda: run_ours(True),
                "plain": plain_step,
            },
            args.rounds,
            args.warmup,
        )
    if dist.get_rank() == 0:
        where = (
            torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else f"CPU, {os.cpu_count()} cores"
        )
        print(
            f"\nworkbench vs a plain PyTorch loop — {args.model}, {cfg.precision}, attention {cfg.attention}, "
            f"batch {args.global_batch}×{cfg.model_config.seq_len}{', compiled' if args.compile else ''}, "
            f"{where}, torch {torch.__version__}; {args.rounds} rounds "
            f"{'a side at a time (ours timed and freed, then plain)' if args.one_side_at_a_time else 'interleaved'}"
        )
        print(
            f"  median step   ours fast {med['ours_fast'] * 1e3:8.2f} ms   ours measured "
            f"{med['ours_measured'] * 1e3:8.2f} ms   plain {med['plain'] * 1e3:8.2f} ms"
        )
        print("  " + report("ours (fast steps) / plain", med.ratio("ours_fast", "plain")))
        print(
            "  " + report("ours (every step measured) / plain", med.ratio("ours_measured", "plain"))
        )
        speed = throughput(cfg, med, where if device.type == "cuda" else None)
        print(
            "  tokens/s  "
            + "   ".join(
                f"{k} {v['tokens_per_s']:,.0f}" + (f" (MFU {v['mfu']:.1%})" if v["mfu"] else "")
                for k, v in speed.items()
            )
        )
        # scripts/gpu_check.sh's summary table reads these
        if path := os.environ.get("WB_BENCH_JSON"):
            with open(path, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "model": args.model,
                            "precision": cfg.precision,
                            "compiled": args.compile,
                            "sequential": args.one_side_at_a_time,
                            "device": where,
                            "speed": speed,
                            "ratio_fast": vars(med.ratio("ours_fast", "plain")),
                            "ratio_measured": vars(med.ratio("ours_measured", "plain")),
                        }
                    )
                    + "\n"
                )
    dist.barrier()
    dist.destroy_process_group()


def throughput(cfg, med, gpu_name: str | None) -> dict:
    """tokens/s of each candidate at its median step, and on a GPU its MFU (predict/formulas/flops.py over the
    device's dense peak: predict/hardware.py, or PEAK_TFLOPS)."""
    from workbench.predict.formulas import mfu
    from workbench.predict.hardware import PEAK_ENV, peak_flops

    peak = peak_flops(gpu_name, cfg.precision, os.environ.get(PEAK_ENV)) if gpu_name else None
    tokens = cfg.global_batch * cfg.model_config.seq_len
    return {
        k: {
            "step_s": med[k],
            "tokens_per_s": tokens / med[k],
            "mfu": mfu(cfg.model_config, tokens / med[k], peak) if peak else None,
        }
        for k in ("ours_fast", "ours_measured", "plain")
    }


def plain_loop(cfg, GPT, device, batches, step):  # the loop a user would write
    """nanoGPT's training step on `GPT`; returns a callable that runs one step and returns its loss."""
    import contextlib

    import torch

    from workbench.model.gpt import ModelWiring

    torch.manual_seed(cfg.seed)
    wiring = ModelWiring(fused_attention=cfg.attention == "sdpa")
    # built on the device, not on the host and then copied (gpt-1.3b: 5 GB of fp32)
    with torch.device("meta"):
        model = GPT(cfg.model_config, wiring=wiring)
    model.to_empty(device=device)
    model.tie()
    model.init_weights(cfg.seed)
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        fused=cuda or None,
        foreach=None if cuda else True,
    )
    forward = torch.compile(model) if cfg.compile else model
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if cuda and cfg.precision == "bf16"
        else contextlib.nullcontext()
    )
    state = {"next": None}

    def one() -> float:
        step["plain"] += 1
        x, y = state["next"] or batches.get(step["plain"])
        with autocast:
            loss = forward(x, y)
        if step["plain"] + 1 < cfg.steps:  # fetch the next batch while the forward runs (nanoGPT)
            state["next"] = batches.host(step["plain"] + 1)
            if cuda:
                state["next"] = tuple(
                    t.pin_memory().to(device, non_blocking=True) for t in state["next"]
                )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return one


def free_device(device) -> None:
    """Let go of a side's model, optimizer and compiled graphs before the other side is built."""
    import gc

    import torch

    torch._dynamo.reset()  # the compiled graphs hold their own references
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def parse(argv: list[str]) -> argparse.Namespace:
    p = common_arguments(__doc__, ranks=1, rounds=40)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--attention", default="eager", choices=("eager", "sdpa"))
    p.add_argument(
        "--compile", action="store_true", help="ours: each block compiled; plain: the whole model"
    )
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument(
        "--one-side-at-a-time",
        action="store_true",
        help="ours timed and freed, then plain (not interleaved): for a model both sides cannot hold",
    )
    args = p.parse_args(argv)
    if args.ranks != 1:
        p.error("--ranks: one process (the plain loop has no parallelism)")
    return args


if __name__ == "__main__":
    sys.exit(entry(__file__, parse, worker))
