"""The `workbench` command.

    workbench run --dp 2 --steps 20 --model tiny --global-batch 16 --seed 0 --out traces/dp2
    workbench run --dp 2 --allreduce ring --bucket-mb 0.05 --out traces/ring
    workbench run --dp 8 --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500   # on each machine
    workbench validate traces/dp2        # check the traces against docs/run-format.md
    workbench show traces/dp2            # the summary: step time, overlap, memory measured vs predicted
    workbench report traces/dp2          # its charts in one HTML file: traces/dp2/report.html
    workbench compare '{"dp": 2}' '{"dp": 2, "zero": 3}' --out traces/compare   # table.csv + report.html

A bad configuration is reported (exit code 2) before any process starts.
"""

from __future__ import annotations

import argparse
import json
import sys

from workbench.config import (
    ALLREDUCE,
    BACKENDS,
    DP_IMPLS,
    FAULTS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    RunConfig,
)
from workbench.config.rules import ATTENTION, OPTIMIZERS


def _model(value: str) -> str | dict:
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"--model {value!r} is not valid JSON ({e.msg} at character {e.pos}); "
                                             f"e.g. '{{\"base\": \"small\", \"layers\": 8}}'") from None
    return value


def _add_fault_tolerance(run: argparse.ArgumentParser, d: RunConfig) -> None:
    """Checkpoints, resume, restarts, and the faults that exercise them."""
    run.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                     help="a DCP checkpoint every N steps (0: never)")
    run.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default RUN/checkpoints)")
    run.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints, help="keep the newest K (0: all)")
    run.add_argument("--resume", default=None,
                     help="a checkpoint, a directory of them, or 'auto' (the newest good one in the checkpoint dir)")
    run.add_argument("--max-restarts", type=int, default=d.max_restarts,
                     help="torchrun restarts the group up to R times after a failure; each resumes from the newest "
                          "checkpoint")
    run.add_argument("--loss-spike-factor", type=float, default=d.loss_spike_factor,
                     help="skip a step whose loss exceeds F × the median of the last 10 (0: off)")
    run.add_argument("--fault", default=None, choices=FAULTS, help="inject a fault (teaching and tests)")
    run.add_argument("--fault-rank", type=int, default=d.fault_rank)
    run.add_argument("--fault-step", type=int, default=d.fault_step)
    run.add_argument("--fault-delay-s", type=float, default=d.fault_delay_s,
                     help="straggle: the seconds the fault rank sleeps in each step")


def _add_communication(run: argparse.ArgumentParser, d: RunConfig) -> None:
    """How gradients travel: the all-reduce, buckets, compression, and the emulated network."""
    run.add_argument("--allreduce", default=d.allreduce, choices=ALLREDUCE,
                     help="the gradient all-reduce: the backend's, our send/recv ring, or hierarchical (reduce-scatter "
                          "inside each machine, all-reduce across, all-gather inside)")
    run.add_argument("--ranks-per-node", type=int, default=d.ranks_per_node,
                     help="ranks per (emulated) machine, for hierarchical and --emulate-link (0: the real machine's)")
    run.add_argument("--emulate-link", default=None,
                     help="a teaching device: hold messages as if sent over 'inter=BW_GBps,LATENCY_us;"
                          "intra=BW_GBps,LATENCY_us' links between emulated machines")
    run.add_argument("--optimizer", default=d.optimizer, choices=OPTIMIZERS,
                     help="onebit-adam: AdamW for --onebit-warmup-steps, then frozen variance and the momentum "
                          "all-reduced as signs with error feedback (1/32 of the bytes)")
    run.add_argument("--onebit-warmup-steps", type=int, default=d.onebit_warmup_steps)
    run.add_argument("--dp-impl", default=d.dp_impl, choices=DP_IMPLS)
    run.add_argument("--bucket-mb", type=float, default=d.bucket_mb)
    run.add_argument("--grad-compression", default=d.grad_compression, choices=("none", "bf16", "fp16"),
                     help="cast gradient buckets to 16 bits for the all-reduce (torch DDP's compress hooks)")


def _add_data_and_tools(run: argparse.ArgumentParser, d: RunConfig) -> None:
    """The tokens, the attention kernel, compilation, which steps are measured, and the tools people watch
    training with."""
    run.add_argument("--data", default=d.data,
                     help="'synthetic' (a learnable Markov chain), a nanoGPT .bin file (uint16 token ids), or "
                          "'text:FILE' (the file's bytes as tokens: vocab 256, no tokenizer)")
    run.add_argument("--attention", default=d.attention, choices=ATTENTION,
                     help="eager: written out (what the activation formula counts); sdpa: torch's fused kernel")
    run.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    run.add_argument("--measure", default=d.measure, metavar="auto|all|none|A:B",
                     help="steps that record memory and synchronise (the rest run fast): auto = every step on a "
                          "CPU, three after the warm-up on a GPU")
    run.add_argument("--tensorboard", action="store_true",
                     help="write loss, lr, grad norm, tokens/s, time split and memory per step into RUN/tb")
    run.add_argument("--wandb", nargs="?", const="workbench", default=None, metavar="PROJECT",
                     help="log what --tensorboard logs, the config and the summary to W&B (project 'workbench' "
                          "unless named); offline under RUN/wandb/ unless you have logged in (wandb sync uploads it)")
    run.add_argument("--gpu-health-every", type=int, default=d.gpu_health_every, metavar="K",
                     help="CUDA ranks read their GPU through NVML (temperature, power, SM clock, throttling, ECC, "
                          "Xid) every K steps into gpu_health.jsonl and the trace; 0: never")
    run.add_argument("--nsys", action="store_true",
                     help="each rank under Nsight Systems (nsys profile -t cuda,nvtx,osrt) into RUN/nsys/rank<r>"
                          ".nsys-rep; our spans are its NVTX ranges (needs nsys on PATH and CUDA ranks)")
    run.add_argument("--profile-steps", default=None,
                     help="'A:B': a torch.profiler (Kineto) trace of steps A..B-1 per rank into RUN/profile "
                          "(Perfetto, TensorBoard's profiler, Holistic Trace Analysis)")


def _add_launch(run: argparse.ArgumentParser) -> None:
    """Where the run goes and which machines take part."""
    run.add_argument("--out", default=None, help="run directory (default traces/<name>, or traces/run-<time>)")
    run.add_argument("--launcher", default="torchrun", choices=("torchrun", "ray"),
                     help="torchrun (default), or ray: the ranks as Ray Train workers (a local Ray unless "
                          "--ray-address; pip install 'ray[train]')")
    run.add_argument("--ray-address", default=None, metavar="ADDR", help="a running Ray cluster (--launcher ray)")
    run.add_argument("--force", action="store_true",
                     help="replace an earlier run in --out (without it, an existing run directory is an error)")
    run.add_argument("--name", default=None)
    run.add_argument("--nnodes", default="1",
                     help="machines: a count, or MIN:MAX for elastic membership (the run re-forms its group, and dp, "
                          "when a machine leaves or joins; needs --checkpoint-every and --max-restarts)")
    run.add_argument("--node-rank", type=int, default=0)
    run.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the first machine")
    run.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_other_commands(sub: argparse._SubParsersAction) -> None:
    """compare, validate, show, doctor, report, schedule, checkpoint."""
    cmp = sub.add_parser("compare", help="run several configurations and compare them side by side")
    cmp.add_argument("configs", nargs="+",
                     help="each a JSON object of RunConfig fields, e.g. '{\"dp\": 2, \"zero\": 3}', or a .json file")
    cmp.add_argument("--out", default="traces/compare", help="where the runs, table.csv and report.html go")
    cmp.add_argument("--force", action="store_true", help="replace the runs of an earlier comparison in --out")
    cmp.add_argument("--no-calibrate", action="store_true", help="skip measuring this machine (no time estimates)")
    cmp.add_argument("--wandb", nargs="?", const="workbench", default=None, metavar="PROJECT",
                     help="also log the table to W&B as a run of its own (offline under OUT/wandb/ without a login)")

    for name, text in (("validate", "check a run's traces against the run format"),
                       ("show", "print a run's summary"),
                       ("doctor", "why a run failed: the first cause, and who was behind at which collective")):
        p = sub.add_parser(name, help=text)
        p.add_argument("run_dir")
    rpt = sub.add_parser("report", help="one run's charts in a self-contained HTML file (RUN/report.html)")
    rpt.add_argument("run_dir")
    rpt.add_argument("--out", default=None, help="where the HTML goes (default RUN/report.html)")
    sch = sub.add_parser("schedule", help="a pipeline schedule as data: show its grid and bubble, or export it "
                                          "(torch-csv: torch pipelining's CSV, which --schedule csv:FILE runs)")
    sch.add_argument("action", choices=("show", "export"))
    sch.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b, interleaved, zbh1, zbv or csv:FILE")
    sch.add_argument("--pp", type=int, default=2)
    sch.add_argument("--microbatches", type=int, default=4)
    sch.add_argument("--virtual-stages", type=int, default=1)
    sch.add_argument("--format", default="torch-csv", choices=("torch-csv", "json"))
    sch.add_argument("--out", default=None, help="export: the file (default: standard output)")
    ckpt = sub.add_parser("checkpoint", help="what a checkpoint holds")
    ckpt.add_argument("action", choices=("inspect",))
    ckpt.add_argument("path", help="a checkpoint directory (RUN/checkpoints/step_N)")


def _grid_args(run: argparse.ArgumentParser, d: RunConfig) -> None:
    """The parallel axes: dp, tp, pp, cp (and how its ring balances and rotates), ep and the MoE's dispatch."""
    for axis, text in (("dp", "data-parallel replicas"), ("tp", "tensor-parallel ranks (Megatron)"),
                       ("pp", "pipeline stages"), ("cp", "context-parallel ranks: each holds s/cp tokens, "
                                                         "attention is a ring")):
        run.add_argument(f"--{axis}", type=int, default=getattr(d, axis), help=f"{text}; world size = dp×cp×tp×pp")
    run.add_argument("--cp-balance", default=d.cp_balance, choices=("head-tail", "none"))
    run.add_argument("--cp-rotate", default=d.cp_rotate, choices=("ring", "allgather"))
    run.add_argument("--ep", type=int, default=d.ep, help="expert-parallel ranks, carved from dp (a model with "
                                                          "experts: tiny-moe, small-moe, gpt2-small-moe)")
    run.add_argument("--moe-dispatch", default=d.moe_dispatch, choices=("dropless", "capacity"))
    run.add_argument("--capacity-factor", type=float, default=d.capacity_factor,
                     help="capacity dispatch: each expert takes ⌈F·T·k/E⌉ of a rank's assignments, the rest dropped")
    run.add_argument("--aux-loss-coef", type=float, default=d.aux_loss_coef, help="the Switch load-balancing loss")
    run.add_argument("--router-bias-rate", type=float, default=d.router_bias_rate,
                     help="aux-loss-free balancing (DeepSeek-V3): the per-expert bias's step; 0 off")


def build_parser() -> argparse.ArgumentParser:
    from workbench import __version__

    parser = argparse.ArgumentParser(prog="workbench", description="Run and profile distributed training.")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="launch a training run with torchrun",
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d = RunConfig()
    run.add_argument("--model", type=_model, default=d.model,
                     help="a preset (tiny, small, gpt2-small, gpt2-medium, gpt-1.3b; tiny-moe, small-moe, "
                          "gpt2-small-moe), "
                          "or JSON changes to one: "
                          "'{\"base\": \"small\", \"layers\": 8}' "
                          "(base tiny when left out; the dims that result are printed)")
    _grid_args(run, d)
    run.add_argument("--zero", type=int, default=d.zero, choices=(0, 1, 2, 3),
                     help="ZeRO stage over dp: 1 optimizer states, 2 + gradients, 3 + parameters partitioned")
    run.add_argument("--offload-optimizer", action="store_true",
                     help="ZeRO-Offload (zero 1, 2 or 3): master weights, gradient slices and Adam's moments in host "
                          "memory, the update on the CPU (torch's AdamW), each gradient slice copied once reduced")
    run.add_argument("--no-prefetch", action="store_true", help="ZeRO-3: do not gather the next layer ahead")
    run.add_argument("--schedule", default=d.schedule, metavar="|".join(SCHEDULES) + "|csv:FILE",
                     help="pipeline schedule; csv:FILE runs a torch pipelining CSV (0F0, 0I0, 0W0 ...)")
    run.add_argument("--microbatches", type=int, default=d.microbatches)
    run.add_argument("--virtual-stages", type=int, default=d.virtual_stages)
    run.add_argument("--precision", default=d.precision, choices=PRECISIONS)
    run.add_argument("--grad-reduce-dtype", default=d.grad_reduce_dtype, choices=PRECISIONS,
                     help="16-bit runs: accumulate and all-reduce gradients in fp32 (default) or in 16 bits")
    run.add_argument("--recompute", default=d.recompute, choices=RECOMPUTE)
    run.add_argument("--sequence-parallel", action="store_true")
    run.add_argument("--global-batch", type=int, default=d.global_batch,
                     help="sequences per optimizer step, over all dp ranks and microbatches")
    run.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    run.add_argument("--seed", type=int, default=d.seed, help="model and data seed: equal seeds, equal runs")
    run.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    run.add_argument("--lr-schedule", default=d.lr_schedule, choices=("constant", "cosine"))
    run.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    run.add_argument("--grad-clip", type=float, default=d.grad_clip, help="0 disables clipping")
    run.add_argument("--backend", default=d.backend, choices=BACKENDS,
                     help="auto: nccl where CUDA is present, else gloo")
    _add_communication(run, d)
    run.add_argument("--timeout", type=float, default=d.timeout_s, help="process-group timeout, seconds")
    run.add_argument("--no-trace", action="store_true")
    run.add_argument("--warmup-steps-excluded", type=int, default=d.warmup_steps_excluded,
                     help="summary time figures and charts leave out this many first steps (warm-up)")
    run.add_argument("--profile-memory", action="store_true",
                     help="record the allocator beside the categories (CPU: torch.profiler memory events; "
                          "CUDA: a snapshot for pytorch.org/memory_viz) until the end of --profile-memory-step")
    run.add_argument("--profile-memory-step", type=int, default=d.profile_memory_step)
    _add_data_and_tools(run, d)
    _add_fault_tolerance(run, d)
    _add_launch(run)

    _add_other_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from workbench.cli.commands import cmd_compare, cmd_report, cmd_run, cmd_schedule, cmd_show

    a = build_parser().parse_args(argv)
    if a.command == "run":
        return cmd_run(a)
    if a.command == "validate":
        from workbench.trace.validate import validate_run

        errors = validate_run(a.run_dir)
        for e in errors:
            print(e)
        print(f"{a.run_dir}: {'valid' if not errors else f'{len(errors)} problem(s)'}")
        return 1 if errors else 0
    if a.command == "compare":
        return cmd_compare(a)
    if a.command == "show":
        return cmd_show(a.run_dir)
    if a.command == "report":
        return cmd_report(a.run_dir, a.out)
    if a.command == "schedule":
        return cmd_schedule(a)
    if a.command == "doctor":
        from workbench.analysis.doctor import diagnose

        print(diagnose(a.run_dir))
        return 0
    if a.command == "checkpoint":
        from workbench.engine.checkpoint.files import CheckpointError
        from workbench.engine.checkpoint.save_load import describe

        try:
            print(describe(a.path))
        except CheckpointError as e:
            print(f"workbench: {e}", file=sys.stderr)
            return 1
        return 0
    return 2
