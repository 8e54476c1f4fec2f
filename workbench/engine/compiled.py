"""torch.compile for the transformer blocks (`RunConfig.compile`, `--compile`), as torchtitan applies it:
each block compiled on its own, whole (`fullgraph=True`: a graph break would run part of it eagerly without
a word, so it is an error instead). Every block has the same shapes, so one compilation serves them all.

What communicates, traces or counts stays outside the compiled regions and runs as before: the gradient
hooks of data parallelism and ZeRO-1/2 (on the parameters, in autograd), the pipeline's transfers, the
embeddings, the head and the loss, every span of the trace recorder. What would sit inside a block is
refused before launch (config/rules.check_compile): tensor and context parallelism's collectives, a
mixture of experts' routing, ZeRO-3's gathers, recomputation, the zero-bubble split.

Inductor fuses the element-wise chains and may reorder reductions, so a compiled run's losses equal the
eager one's within fp32 rounding, not bit for bit (tests/test_compiled.py states the tolerance). In a
measured step the saved-tensor hooks count what the compiled graph keeps for backward — what inductor's
partitioner chose (it recomputes cheap element-wise results rather than keep them) — so a compiled block's
activations come in under the eager formula's.
"""

from __future__ import annotations

from torch import nn

from workbench.model.gpt import Block


def compile_blocks(model: nn.Module) -> int:
    """Compile every transformer block of `model` in place (its parameters unchanged); returns how many."""
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    for block in blocks:
        block.compile(fullgraph=True)
    return len(blocks)
