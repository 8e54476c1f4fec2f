"""`python -m workbench.exercises.on_rank --run-dir DIR` (torchrun starts it: exercises/ranks.run_on_ranks):
one rank of an exercise. It sets itself up as a training rank does (engine/context.setup: the process groups
with the run's timeout, the traced communicator, the recorder, the memory tracker), loads the learner's
solution.py — or the reference answer where the run has none —, hands both to the exercise's `on_rank`,
and writes what that returned (exercise_rank{r}.json) and its trace. A rank whose solution raises writes its
error file as a training rank does, so the launcher names the rank, the error and the line."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from workbench.config import RunConfig
from workbench.engine.context import RankContext, setup
from workbench.exercises.submission import load
from workbench.trace.disk import reserve_error_file, write_error_file


@contextmanager
def traced_step(ctx: RankContext, step: int) -> Iterator[None]:
    """One step of an exercise as the trace format has it: the communicator's step number and a
    `ProfilerStep#N` span (the timeline draws steps from it)."""
    ctx.comm.start_step(step)
    with ctx.recorder.span(f"ProfilerStep#{step}", "step", "compute", step=step):
        yield
    ctx.comm.end_step()


def solution_for(exercise: str, run_dir: str) -> Any:
    """The learner's function from DIR/solution.py, else the package's reference answer."""
    path = os.path.join(run_dir, "solution.py")
    if os.path.exists(path):
        with open(path) as f:
            return load(f.read(), filename=path)
    from workbench.exercises import answers

    return answers.ANSWERS[exercise]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", required=True)
    run_dir = parser.parse_args(argv).run_dir
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", 0))
    reserved = reserve_error_file(run_dir, rank)
    ctx: RankContext | None = None
    try:
        with open(os.path.join(run_dir, "request.json")) as f:
            config = RunConfig.from_dict(json.load(f))
        with open(os.path.join(run_dir, "exercise.json")) as f:
            spec = json.load(f)
        ctx = setup(config, run_dir)
        module = importlib.import_module(
            f"workbench.exercises.{spec['exercise'].replace('-', '_')}"
        )
        found = module.on_rank(ctx, solution_for(spec["exercise"], run_dir), spec["settings"])
        with open(os.path.join(run_dir, f"exercise_rank{rank}.json"), "w") as f:
            json.dump(found, f)
        ctx.recorder.write(os.path.join(run_dir, f"trace_rank{rank}.json"))
        ctx.comm.barrier()
        dist.destroy_process_group()
        os.remove(reserved)
        return 0
    except BaseException as e:
        err = {
            "rank": rank,
            "time": time.time(),
            "type": type(e).__name__,
            "message": str(e),
            "traceback": traceback.format_exc(),
            "secondary": type(e).__name__ == "CommError",
        }
        write_error_file(os.path.join(run_dir, f"error_rank{rank}.json"), reserved, err)
        if ctx is not None:
            ctx.recorder.write(os.path.join(run_dir, f"trace_rank{rank}.json"))
        print(
            f"[workbench] rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
