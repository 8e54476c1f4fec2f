"""The subcommands that read checkpoints on this one process: checkpoint (inspect, verify) and sample.

workbench checkpoint inspect traces/dp2/checkpoints/step_10   # what it holds
workbench checkpoint verify traces/dp2                         # its files' sizes and CRC32 checksums
workbench sample traces/dp2 --tokens 100                       # text from the run's newest checkpoint
"""

from __future__ import annotations

import argparse
import sys


def add_checkpoint_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("inspect", "verify"))
    p.add_argument(
        "path", help="a checkpoint (RUN/checkpoints/step_N); verify: also a run or its checkpoints/"
    )


def checkpoint(a: argparse.Namespace) -> int:
    """inspect: what the checkpoint holds (1: not a checkpoint); verify: each one's bytes (1: none or a bad one)."""
    from workbench.engine.checkpoint.files import CheckpointError, verify_all

    if a.action == "verify":
        results = verify_all(a.path)
        for path, problem in results:
            print(f"{path}: {problem or 'good (sizes and CRC32 checksums)'}")
        if not results:
            print(f"{a.path}: no checkpoint here")
        return 1 if not results or any(p and p.startswith("BAD") for _, p in results) else 0
    from workbench.engine.checkpoint.save_load import describe

    try:
        print(describe(a.path))
    except CheckpointError as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 1
    return 0


def add_sample_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path", help="a run directory, its checkpoints/ or one checkpoint (RUN/checkpoints/step_N)"
    )
    p.add_argument(
        "--prompt",
        default="",
        help="where the text starts (token ids, space-separated, for data "
        "without a tokenizer here); default: a newline, or token 0",
    )
    p.add_argument(
        "--tokens", type=int, default=200, help="how many tokens to sample (default: 200)"
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="logits ÷ T; 0: the likeliest token (default: 0.8)",
    )
    p.add_argument("--top-k", type=int, default=None, help="draw only among the K likeliest tokens")
    p.add_argument(
        "--seed", type=int, default=0, help="the draws' seed: equal seeds, equal samples"
    )


def sample(a: argparse.Namespace) -> int:
    """The sampled text on standard output, which checkpoint it came from on standard error; 2 on bad input."""
    from workbench.config import ConfigError
    from workbench.engine import sample as sampling
    from workbench.engine.checkpoint.files import CheckpointError

    try:
        s = sampling.sample(
            a.path,
            prompt=a.prompt,
            tokens=a.tokens,
            temperature=a.temperature,
            top_k=a.top_k,
            seed=a.seed,
        )
    except (CheckpointError, ConfigError) as e:
        print(f"workbench: {e}", file=sys.stderr)
        return 2
    print(f"[{s.checkpoint}: the model before step {s.step}]", file=sys.stderr)
    print(s.text)
    return 0
