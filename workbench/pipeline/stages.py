"""Stage partitioning: the GPT's L layers cut into S = pp × virtual_stages equal stages.

Stage k holds layers [k·L/S, (k+1)·L/S); stage 0 also holds the embeddings, stage S − 1 the final
layer norm, the head and the loss. Stage k lives on pipeline rank k mod pp as its chunk k // pp.
Each stage is a `GPT` built with just its layers, initialised by parameter name — so it holds exactly
its slice of the single-process model.
"""

from __future__ import annotations

import torch
from torch import nn

from workbench.config import ModelConfig
from workbench.engine.model import GPT
from workbench.engine.recompute import Recompute
from workbench.parallel.tp_communications import TPContext
from workbench.pipeline.schedule import Schedule


def stage_layers(layers: int, stages: int, stage: int) -> range:
    per = layers // stages
    return range(stage * per, (stage + 1) * per)


def build_stages(cfg: ModelConfig, schedule: Schedule, pp_rank: int, seed: int, tp: TPContext | None,
                 device: torch.device, recompute: Recompute | None = None) -> dict[int, nn.Module]:
    """The chunks (stage index → module) that live on pipeline rank `pp_rank`."""
    chunks: dict[int, nn.Module] = {}
    last = schedule.stages - 1
    for chunk in range(schedule.v):
        stage = chunk * schedule.p + pp_rank
        with torch.device(device):
            chunks[stage] = GPT(cfg, seed=seed, tp=tp, layers=stage_layers(cfg.layers, schedule.stages, stage),
                                first=stage == 0, last=stage == last, recompute=recompute)
    return chunks
