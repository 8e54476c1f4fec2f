"""How a rank's durations change with the layout, for what-if edits (analysis/what_if.py): the stretch of
cores shared by more ranks, and an action's time at another micro-batch size. No torch.
"""

from __future__ import annotations

import os
from typing import Any


def stretch(config: dict[str, Any], hardware: Any, cores: int | None, busy: float = 1.0) -> Any:
    """world → the factor every duration of a rank takes with `world` ranks sharing the machine: 1 on GPUs;
    on a CPU the measured stretch of a calibrated `hardware` (its `contention`), else processor sharing —
    `world` ranks each on a core for the share `busy` of its step (the source run's compute and host time:
    a blocked rank leaves its core to the others) want world·busy cores of the `cores` there are."""
    if config.get("device", "cpu") != "cpu":
        return lambda world: 1.0
    if hardware is not None and getattr(hardware, "contention", None):
        from workbench.predict.action_costs import contention

        return lambda world: contention(hardware, world)[0]
    n = cores or os.cpu_count() or 1
    return lambda world: max(1.0, world * busy / n)


def compute_ratio(
    config: dict[str, Any], hardware: Any, micro: int, micro_new: int
) -> tuple[float, float]:
    """(forward, backward) time of one action at `micro_new` sequences over at `micro`: per token without a
    calibrated `hardware`; with one, its fixed cost per layer kept and the rest by its rates (a small
    micro-batch is mostly fixed cost: Python, launches)."""
    if hardware is None or not getattr(hardware, "layer_fwd_s", 0.0):
        return micro_new / micro, micro_new / micro
    from workbench.predict.action_costs import Layout, cost_context, layer_costs
    from workbench.predict.formulas import run_model

    model = run_model(config)

    def layer(m: int) -> tuple[float, float]:
        L = Layout(
            model=model,
            tp=config["tp"],
            micro=m,
            sequence_parallel=config.get("sequence_parallel", False),
            recompute=config.get("recompute", "none"),
            width=4 if config.get("precision") == "fp32" else 2,
        )
        costs = layer_costs(L, hardware, cost_context(L, hardware))
        return (
            costs["compute"][0] + costs["overhead"][0],
            costs["compute"][1] + costs["overhead"][1],
        )

    (f0, b0), (f1, b1) = layer(micro), layer(micro_new)
    return f1 / f0, b1 / b0
