"""Learning-rate warm-up then cosine decay (the schedule of GPT-3, Megatron-LM and torchtitan).

    step < warmup:     lr · (step + 1) / warmup                       linear warm-up
    afterwards:        min_lr + (lr − min_lr) · ½(1 + cos(π · progress))  cosine decay to min_lr
    progress = (step − warmup) / max(1, steps − warmup − 1)

With schedule 'constant' (and no warm-up) the rate stays at lr. Pure arithmetic: the metrics record
the value used at each step, and the notebooks draw it without torch.
"""

from __future__ import annotations

import math


def lr_at(
    step: int,
    lr: float,
    *,
    steps: int,
    schedule: str = "constant",
    warmup_steps: int = 0,
    min_lr_ratio: float = 0.1,
) -> float:
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    min_lr = lr * min_lr_ratio
    progress = (step - warmup_steps) / max(1, steps - warmup_steps - 1)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
