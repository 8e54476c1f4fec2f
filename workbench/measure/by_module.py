"""What each part of a model costs, measured on one forward: the bytes it saves for backward and the FLOPs
it runs, by the kind of module that did it (attention, MLP, norms ...). For teaching what a block's parts
weigh (notebook 11: what grouped-query attention and SwiGLU change) — beside the formulas' split.

    saved_bytes_by_part   the tensors autograd saves, through `torch.autograd.graph.saved_tensors_hooks`
                          (as measure/memory.py counts activations: each storage once, parameters not),
                          each given to the innermost running module whose name ends in one of `parts`
    flops_by_part         torch's own FLOP counter (`torch.utils.flop_counter.FlopCounterMode`: each matmul's
                          FLOPs from the shapes it actually ran with), summed by the same parts; it runs on
                          meta tensors too, so Llama 3's 8B is counted at 8,192 tokens without memory

A tensor saved outside every part (the embedding, the head, the loss) is under "other".
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn


def _part(name: str, parts: Sequence[str]) -> str | None:
    leaf = name.rsplit(".", 1)[-1]
    return leaf if leaf in parts else None


def saved_bytes_by_part(
    model: nn.Module,
    *inputs: Any,
    parts: Sequence[str] = ("attn", "mlp", "ln_1", "ln_2"),
    per_layer: bool = True,
) -> dict[str, int]:
    """Bytes saved for backward by each part during one forward of `model(*inputs)` (÷ the number of
    blocks with `per_layer`, for parts inside blocks); the graph is dropped afterwards."""
    running: list[str] = []
    counted: dict[str, int] = {}
    seen: set[int] = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen |= {b.untyped_storage().data_ptr() for b in model.buffers()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if isinstance(t, nn.Parameter) or ptr == 0 or ptr in seen:
            return t
        seen.add(ptr)
        where = running[-1] if running else "other"
        counted[where] = counted.get(where, 0) + t.untyped_storage().nbytes()
        return t

    def enter(part: str) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            running.append(part)

        return hook

    def leave(module: nn.Module, args: Any, output: Any) -> None:
        running.pop()  # (a forward hook returning something would replace the module's output)

    with ExitStack() as stack:
        for name, module in model.named_modules():
            part = _part(name, parts)
            if part is None:
                continue
            stack.enter_context(module.register_forward_pre_hook(enter(part)))
            stack.enter_context(module.register_forward_hook(leave))
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        out = model(*inputs)
    del out
    if per_layer:
        blocks = sum(1 for name, _ in model.named_modules() if _part(name, parts[:1]))
        return {k: v // blocks if k != "other" else v for k, v in counted.items()}
    return counted


def flops_by_part(
    model: nn.Module,
    *inputs: Any,
    parts: Sequence[str] = ("attn", "mlp", "ln_1", "ln_2"),
    per_layer: bool = True,
) -> dict[str, int]:
    """Forward FLOPs of one `model(*inputs)` by part, as torch's FLOP counter counts them (matmuls and
    attention kernels: element-wise work counts 0), ÷ the blocks with `per_layer`."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(*inputs)
    out: dict[str, int] = {}
    total = 0
    for name, ops in counter.get_flop_counts().items():
        flops = int(sum(ops.values()))
        if name == "Global":
            total = flops
            continue
        part = _part(name, parts)
        # GPT.blocks.<i>.<part>: each part once, not its children
        if part is not None and name.count(".") == 3:
            out[part] = out.get(part, 0) + flops
    out["other"] = total - sum(out.values())
    if per_layer:
        blocks = sum(1 for name, _ in model.named_modules() if _part(name, parts[:1]))
        return {k: v // blocks if k != "other" else v for k, v in out.items()}
    return out
