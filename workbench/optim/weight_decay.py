"""Which elements AdamW's weight decay shrinks: the matrices, as LLMs are trained.

GPT-2/3, nanoGPT (`configure_optimizers`), Megatron-LM (`get_param_groups`) and Llama decay the weight
matrices and leave the 1-D tensors alone: the norms' gains and every bias. Shrinking a gain towards 0 fights
the normalisation it scales, and a bias has no scale to regularise. Embeddings are matrices and decay in
nanoGPT and Megatron; `RunConfig.decay_embeddings=False` leaves them out, as some recipes do.

Each parameter is marked `decays` when the model is built (`mark_decay`, after tensor parallelism's swap, so
a shard inherits its matrix's mark). A rank's optimizer then needs, for each tensor it updates, the element
ranges that decay (`decay_ranges`):

    a whole parameter or a tensor-parallel shard    all of it, or nothing
    a ZeRO slice of a flat buffer                   the runs of its elements that belong to matrices
                                                    (parallel/flat.py's `marked_runs`: a bucket mixes
                                                    matrices and norms)

An unmarked tensor decays whole: `optim.adamw.AdamW` on its own is torch's AdamW.
"""

from __future__ import annotations

import torch
from torch import nn

#: the parameters that are embedding tables (token, and GPT-2's learned positions)
EMBEDDINGS = ("wte.weight", "wpe.weight")


def mark_decay(model: nn.Module, decay_embeddings: bool = True) -> None:
    """Mark every parameter of `model` with `decays`: matrices (2 or more dimensions: linear weights, the
    experts' stacked weights, embeddings unless `decay_embeddings` is False) yes, gains and biases no. A tied
    head is the token table: it is marked by that name."""
    for name, p in model.named_parameters():
        embedding = name.endswith(EMBEDDINGS)
        p.decays = p.dim() >= 2 and (decay_embeddings or not embedding)


def decay_ranges(t: torch.Tensor) -> list[tuple[int, int]]:
    """The [start, end) element ranges of `t` (flattened) that weight decay shrinks: a ZeRO slice's own ranges
    (parallel/flat.py's `marked_runs`, set where ZeRO cuts it), else all of `t` or nothing by its mark
    (unmarked: all of it, as torch's AdamW)."""
    ranges = getattr(t, "decay_ranges", None)
    if ranges is not None:
        return list(ranges)
    return [(0, t.numel())] if getattr(t, "decays", True) else []
