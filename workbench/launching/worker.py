"""The per-rank entry point that torchrun starts: `python -m workbench.launching.worker --run-dir DIR`.

It reads DIR/request.json (the validated RunConfig), trains, and leaves the run directory of
docs/run-format.md. Failure handling, so that nothing is lost and nothing hangs:

- every rank streams its trace to `trace_rank{r}.partial.jsonl` after each step, so even a rank that
  is SIGKILLed leaves its events (the launcher turns the sidecar into `trace_rank{r}.json`);
- a rank that raises writes `error_rank{r}.json` (its traceback, the time) and its trace, then exits
  non-zero; torchrun then stops the other ranks (SIGTERM, which we turn into an exception so they too
  write what they have);
- every process group has the config's timeout, so a stuck peer ends in a `CommError` naming the
  operation instead of a silent wait — on NCCL too, where the rank's own wait has that deadline
  (comm/device_timing.py);
- a failing rank also writes torch's flight recorder (`fr_trace_rank{r}`: comm/torch_flight_recorder.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from workbench.analysis.summary import build_summary
from workbench.comm import torch_flight_recorder
from workbench.config import RunConfig
from workbench.engine.context import RankContext, place_rank, setup
from workbench.engine.restart import (
    begin_attempt,
    elastic_world,
    restart_count,
    restarted_config,
    write_all_attempts,
)
from workbench.engine.train import train
from workbench.launching.lifetime import die_with_parent
from workbench.trace import strict_json
from workbench.trace.disk import reserve_error_file, write_error_file, writing
from workbench.trace.merge import merge_traces


class Terminated(Exception):
    """torchrun (or the user) asked this rank to stop."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated(
        f"received signal {signum} (torchrun stops the surviving ranks after a failure)"
    )


def finish(ctx: RankContext) -> None:
    """Write this rank's trace; rank 0 gathers every rank's trace (they may live on other hosts),
    writes the ones it lacks, the merged trace.json and summary.json."""
    path = os.path.join(ctx.run_dir, f"trace_rank{ctx.rank}.json")
    ctx.recorder.write(path)
    trace = ctx.recorder.to_dict()
    gathered: list[Any] | None = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(trace, gathered, dst=0)
    if ctx.rank == 0:
        assert gathered is not None
        for r, t in enumerate(gathered):
            other = os.path.join(ctx.run_dir, f"trace_rank{r}.json")
            if not os.path.exists(other):
                with writing(other, f"rank {r}'s trace"), open(other, "w") as f:
                    json.dump(t, f)
        merged = os.path.join(ctx.run_dir, "trace.json")
        with writing(merged, "the merged trace"), open(merged, "w") as f:
            json.dump(merge_traces(gathered), f)
        with open(os.path.join(ctx.run_dir, "config.json")) as f:
            config = json.load(f)
        summary = os.path.join(ctx.run_dir, "summary.json")
        with writing(summary, "summary.json"), open(summary, "w") as f:
            f.write(strict_json.dumps(build_summary(config, gathered), indent=2))
        write_all_attempts(ctx.run_dir, gathered)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread per rank: more oversubscribes the cores and can hang gloo
    # a Ray Train worker runs in a thread
    own_signals = threading.current_thread() is threading.main_thread()
    if own_signals:
        signal.signal(signal.SIGTERM, _on_sigterm)
        die_with_parent()  # a killed torchrun takes its ranks along (workbench/launching/lifetime.py)
    rank = int(os.environ.get("RANK", 0))
    ctx: RankContext | None = None
    reserved = None
    try:
        # small and first: its blocks outlive a full disk
        reserved = reserve_error_file(args.run_dir, rank)
        with open(os.path.join(args.run_dir, "request.json")) as f:
            config: RunConfig = RunConfig.from_dict(json.load(f)).validate()  # the rank's door
        # its place in the grid: torchrun's, or round-robin over the nodes
        rank = place_rank(config)
        restarts = restart_count()  # torchrun's: all this process knows before its group agrees
        config = restarted_config(elastic_world(config), args.run_dir, restarts=restarts)
        ctx = setup(config, args.run_dir)
        # after torchrun restarted or re-formed the group: keep what the last attempt left, then resume;
        # the number the group agreed on is passed on from here, to the trace and to training
        attempt = begin_attempt(args.run_dir, ctx.device)
        if attempt and not restarts:
            # torchrun restarts an agent's ranks without counting it when another node arrives at the
            # rendezvous — as a node the group waited for does when its link is back, if its agent saw the
            # arrival before its own ranks' failure: only the group says this is a restarted attempt, and
            # this rank resumes as the others do (tests/test_node_loss.py)
            ctx.config = restarted_config(ctx.config, args.run_dir, restarts=attempt)
        ctx.recorder.info["attempt"] = attempt
        ctx.recorder.open_partial(os.path.join(args.run_dir, f"trace_rank{rank}.partial.jsonl"))
        logs = train(ctx, attempt=attempt)["logs"]
        finish(ctx)
        if logs is not None:  # rank 0's TensorBoard and W&B, closed once summary.json exists
            logs.close(os.path.join(args.run_dir, "summary.json"))
        ctx.comm.barrier()  # a barrier before destroy avoids rare gloo aborts at exit
        dist.destroy_process_group()
        os.remove(reserved)
        return 0
    except BaseException as e:
        # torchrun's SIGTERM to a rank already failing (its peer died first) must not cut this record short
        if own_signals:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        err = {
            "rank": rank,
            "time": time.time(),
            "type": type(e).__name__,
            "message": str(e),
            "traceback": traceback.format_exc(),
            "coords": ctx.grid.coords(rank) if ctx is not None else None,
            "secondary": isinstance(e, Terminated) or type(e).__name__ == "CommError",
            "last_collectives": ctx.comm.flight.to_list() if ctx is not None else [],
        }
        # before anything big
        write_error_file(os.path.join(args.run_dir, f"error_rank{rank}.json"), reserved, err)
        try:  # torch's own record of its collectives, beside ours (workbench doctor reads both)
            torch_flight_recorder.dump(args.run_dir, rank)
        except Exception:  # never let the record of a failure fail the failure's report
            pass
        if ctx is not None:
            try:
                ctx.recorder.write(os.path.join(args.run_dir, f"trace_rank{rank}.json"))
            except OSError:  # a full disk: the error file is written, and the trace's stream stays
                pass
        print(
            f"[workbench] rank {rank} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True
        )
        return 1


def leave(code: int) -> None:
    """End the rank with `code`. Every file is written and closed by now. A rank torchrun started as its own
    interpreter leaves through os._exit, skipping the C++ static destructors of the communication backend's
    threads, which on rare exits abort the process ("terminate called without an active exception") after a
    successful run. A rank torchrun forked from its agent (`--run-path --start-method fork`: launching/
    warm_torchrun.py) returns to torchrun's wrapper instead — it hands the result back to the agent, which
    waits for it — and multiprocessing ends the process through os._exit itself; a failure is raised as the
    exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    if multiprocessing.parent_process() is None:
        os._exit(code)
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    leave(main())
