"""The validation loss: held-out batches (engine/batches.py's 'val' part: config/data_spec.py says which
tokens) through the run's own strategy, forward only, between two steps.

    every eval_every steps, and after the last    eval_batches held-out batches of global_batch sequences
    each batch                                    the strategy's forward: the whole local batch at once, or
                                                  the pipeline's forward schedule (its F actions and their
                                                  transfers only: pipeline/executor.py's `evaluate`), with
                                                  tensor, sequence, context and expert parallelism as in
                                                  training; ZeRO-3 gathers each unit and frees it again
    the loss                                      summed as training's is (over pp, then over the replicas:
                                                  dp, or dp × cp), averaged over the batches; one read

Under `torch.no_grad()`: nothing is saved for backward and no gradient is touched, so the next step is the
one it would have been — a run with evaluation trains the same model as one without (tested). nanoGPT's
`estimate_loss` is the same idea on one process (it draws new random batches each time; here the held-out
batches are the same at every evaluation, so the curve compares like with like).
"""

from __future__ import annotations

import torch

from workbench.config import RunConfig
from workbench.config.grid import replica_group
from workbench.engine.batches import Batches
from workbench.engine.parallelize import Strategy
from workbench.engine.train_step import global_loss, read


def due(step: int, every: int, steps: int) -> bool:
    """Whether the validation loss is computed after step `step`: every `every` steps and after the last."""
    return every > 0 and ((step + 1) % every == 0 or step == steps - 1)


def evaluate(strategy: Strategy, held_out: Batches, step: int, *, config: RunConfig) -> float:
    """The mean loss over the run's held-out batches (`config.eval_batches` of them), the same number on
    every rank. The config comes from the training loop, as the step's does."""
    total = torch.zeros((), device=strategy.device)
    with (
        strategy.recorder.span(
            "evaluate", "forward", "compute", step=step, batches=config.eval_batches
        ),
        torch.no_grad(),
    ):
        for k in range(config.eval_batches):
            x, y = held_out.get(k)
            total = total + strategy.forward_backward.evaluate(x, y, step).detach().float()
            # CUDA: the next held-out batch made while the GPU runs this one's forward
            held_out.prepare(k + 1)
        summed = global_loss(total, comm=strategy.comm, groups=strategy.groups, config=config)
    replicas = strategy.groups.size(replica_group(config.cp))
    return read(summed, replicas=replicas)[0] / config.eval_batches
