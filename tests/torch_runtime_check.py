"""Run one of our schedules, exported as torch pipelining's CSV, on torch's own runtime
(`torch.distributed.pipelining.schedules._PipelineScheduleRuntime`, which lowers a compute-only CSV to
sends and receives itself) and check it trains the same model as one process.

    torchrun --nproc-per-node P tests/torch_runtime_check.py CSVS MICROBATCHES LAYERS STEPS [DUMP]

For each CSV in CSVS (comma-separated: several in one launch share its start-up and one
single-process reference; a loop such as ZB-H1 and a V such as DualPipeV alike), each rank builds
its stages of our GPT (`pipeline.stages`, initialised by parameter name, so they hold exactly their
slice of the single-process model) and wraps them in torch's `PipelineStage`; rank 0 also trains
the whole model in one process on the same batches. Both use torch's AdamW (lr 3e-3, no weight
decay, no clipping). Rank 0 prints one JSON line: {"torch_runtime": {CSV: per-step losses},
"one_process": per-step losses}. With DUMP (a folder), rank 0 also writes torch's own generated
schedules for these ranks and microbatches there, as CSV (ScheduleInterleavedZeroBubble,
ScheduleZBVZeroBubble, ScheduleDualPipeV, ScheduleInterleaved1F1B: two stages per rank), for the
reverse check. Used by tests/test_zero_bubble.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from workbench.config.model_config import PRESETS, ModelConfig
from workbench.data.synthetic import global_batch
from workbench.model.gpt import GPT
from workbench.pipeline.stages import build_stages
from workbench.schedules.torch_csv import read_csv

BATCH, LR = 8, 3e-3


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1))


def dump_torch_schedules(out: str, world: int, rank: int, m: int) -> None:
    """Torch's generated schedules (two stages per rank), each written by rank 0 as compute-only CSV."""
    from torch.distributed.pipelining import schedules as ts

    for name, cls, v_shape in (
        ("interleaved_zero_bubble", ts.ScheduleInterleavedZeroBubble, False),
        ("zbv_zero_bubble", ts.ScheduleZBVZeroBubble, True),
        ("dualpipev", ts.ScheduleDualPipeV, True),
        ("interleaved_1f1b", ts.ScheduleInterleaved1F1B, False),
    ):
        mine = [rank, 2 * world - 1 - rank] if v_shape else [rank, rank + world]
        stages = [
            PipelineStage(torch.nn.Linear(4, 4), k, 2 * world, torch.device("cpu")) for k in mine
        ]
        sched = cls(stages, m, loss_fn=loss_fn)
        if rank == 0:
            path = os.path.join(out, f"{name}.csv")
            if hasattr(sched, "pipeline_order_with_comms"):
                sched._dump_csv(path, format="compute_only")
            else:
                sched._dump_csv(path)


def train_in_torchs_runtime(path: str, m: int, cfg: ModelConfig, steps: int) -> list[float]:
    """Per-step losses (the same on every rank) of our schedule `path` run by torch's runtime."""
    rank = dist.get_rank()
    ours = read_csv(path, m)  # validated; its stage → rank placement is the one torch infers too
    chunks = build_stages(
        cfg.layers,
        ours,
        rank,
        lambda lay, first, last: GPT(cfg, seed=0, layers=lay, first=first, last=last),
    )
    device = torch.device("cpu")
    stages = [PipelineStage(chunk, k, ours.stages, device) for k, chunk in chunks.items()]
    runtime = _PipelineScheduleRuntime(stages, m, loss_fn=loss_fn, scale_grads=True)
    runtime._load_csv(path, format="compute_only")
    params = [p for c in chunks.values() for p in c.parameters()]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, foreach=False)
    first, last = ours.rank_of(0), ours.rank_of(ours.stages - 1)
    losses = []
    for step in range(steps):
        x, y = global_batch(0, step, BATCH, cfg.seq_len, cfg.vocab_size)
        out: list[torch.Tensor] = []
        kwargs = {}
        if rank == last:
            kwargs.update(target=y, losses=out)
        runtime.step(*([x] if rank == first else []), **kwargs)
        opt.step()
        opt.zero_grad()
        loss = torch.stack(out).mean().detach().reshape(1) if out else torch.zeros(1)
        dist.all_reduce(loss)
        losses.append(loss.item())
    return losses


def one_process(cfg: ModelConfig, steps: int) -> list[float]:
    """Per-step losses of the whole model trained in this process on the same batches."""
    whole = GPT(cfg, seed=0)
    opt = torch.optim.AdamW(whole.parameters(), lr=LR, weight_decay=0.0, foreach=False)
    losses = []
    for step in range(steps):
        x, y = global_batch(0, step, BATCH, cfg.seq_len, cfg.vocab_size)
        loss = loss_fn(whole(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main(paths: str, m: int, layers: int, steps: int, dump: str | None = None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = dataclasses.replace(PRESETS["tiny"], layers=layers)
    runs = {path: train_in_torchs_runtime(path, m, cfg, steps) for path in paths.split(",")}
    if rank == 0:
        print(
            json.dumps({"torch_runtime": runs, "one_process": one_process(cfg, steps)}), flush=True
        )
    if dump:
        dump_torch_schedules(dump, world, rank, m)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
