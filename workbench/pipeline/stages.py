"""Stage partitioning: the model's L layers cut into S = pp × virtual_stages equal stages.

Stage k holds layers [k·L/S, (k+1)·L/S); stage 0 also holds the embeddings, stage S − 1 the final
layer norm, the head and the loss. Stage k lives on pipeline rank k mod pp as its chunk k // pp (in a V,
ZBV's placement, rank r holds stages r and 2·pp − 1 − r: `Schedule.rank_of`). DualPipe's two pipelines each
cut the model in pp parts: stage k and stage pp + k hold copies of part k (`Schedule.model_part`).
Which module a stage is, is the caller's business (`engine/parallelize.py` builds a GPT with just those
layers, initialised by parameter name, so it holds exactly its slice of the single-process model).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from workbench.schedules.build import Schedule


def global_name(name: str) -> str:
    """A chunk's parameter name without its ModuleDict key ("3.blocks.5.ln_1.weight" → "blocks.5.ln_1.weight"):
    the whole model's name."""
    head, _, rest = name.partition(".")
    return rest if head.isdigit() and rest else name


def stage_layers(layers: int, stages: int, stage: int) -> range:
    per = layers // stages
    return range(stage * per, (stage + 1) * per)


def stages_of_rank(schedule: Schedule, pp_rank: int) -> list[int]:
    """The stages (in chunk order) that live on pipeline rank `pp_rank`: pp_rank, pp_rank + p, … in a loop;
    pp_rank and 2p − 1 − pp_rank in a V."""
    return [k for k in range(schedule.stages) if schedule.rank_of(k) == pp_rank]


def build_stages(
    layers: int,
    schedule: Schedule,
    pp_rank: int,
    make_stage: Callable[[range, bool, bool], nn.Module],
) -> dict[int, nn.Module]:
    """The chunks (stage index → module) of pipeline rank `pp_rank`; `make_stage(layers, first, last)`
    builds one."""
    chunks = {}
    for stage in stages_of_rank(schedule, pp_rank):
        part, parts = schedule.model_part(stage)
        chunks[stage] = make_stage(stage_layers(layers, parts, part), part == 0, part == parts - 1)
    return chunks
