"""Which elements AdamW's weight decay shrinks: the matrices, as LLMs are trained.

GPT-2/3, nanoGPT (`configure_optimizers`), Megatron-LM (`get_param_groups`) and Llama decay the weight
matrices and leave the 1-D tensors alone: the norms' gains and every bias. Shrinking a gain towards 0 fights
the normalisation it scales, and a bias has no scale to regularise. Embeddings are matrices and decay in
nanoGPT and Megatron; `RunConfig.decay_embeddings=False` leaves them out, as some recipes do.

Whether a parameter decays is decided when the strategy is built (`decays`, by name and shape, after tensor
parallelism's swap, so a shard has its matrix's answer) and written into its facts (parallel/param_facts.py:
`decay_ranges`). A rank's optimizer then needs, for each tensor it updates, the element ranges that decay
(`ParamFacts.decayed`):

    a whole parameter or a tensor-parallel shard    all of it, or nothing
    a ZeRO slice of a flat buffer                   the runs of its elements that belong to matrices
                                                    (parallel/flat.py's `marked_runs`: a bucket mixes
                                                    matrices and norms; ZeRO's `shard_facts`)

A tensor the facts do not list decays whole: `optim.adamw.AdamW` on its own is torch's AdamW.
"""

from __future__ import annotations

from torch import nn

#: the parameters that are embedding tables (token, and GPT-2's learned positions)
EMBEDDINGS = ("wte.weight", "wpe.weight")


def decays(name: str, p: nn.Parameter, decay_embeddings: bool = True) -> bool:
    """Whether weight decay shrinks parameter `name`: matrices (2 or more dimensions: linear weights, the
    experts' stacked weights, embeddings unless `decay_embeddings` is False) yes, gains and biases no. A tied
    head is the token table: it is answered by that name (its first)."""
    embedding = name.endswith(EMBEDDINGS)
    return p.dim() >= 2 and (decay_embeddings or not embedding)


def decaying(model: nn.Module, decay_embeddings: bool = True) -> dict[str, bool]:
    """`decays` for every parameter of `model`, by name."""
    return {name: decays(name, p, decay_embeddings) for name, p in model.named_parameters()}
