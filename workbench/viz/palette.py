"""One colour per span kind and per memory category, for every chart (timelines, pipeline grids, memory
stacks, the comparison report, the notebooks' own figures): a kind looks the same wherever it shows.

Communication is split three ways, each its own colour, so that an overlap figure never mixes them:
`collective` (a blocking collective, or the host launching an asynchronous one), `collective in flight`
(an asynchronous collective from launch to completion: the transfer, running beside compute) and `wait`
(the host blocked on a handle: waiting for the transfer, or for a slower peer to arrive at it).
"""

from __future__ import annotations

from workbench.trace.recorder import MEMORY_CATEGORIES

SPAN_COLORS = {
    "forward": "#4C78A8",
    "backward": "#F58518",
    "recompute": "#B279A2",
    "optimizer": "#54A24B",
    "collective": "#E45756",
    "collective in flight": "#FF9F9A",
    "p2p": "#9D755D",
    "p2p in flight": "#D8B5A5",
    "wait": "#79706E",
    "ring_step": "#72B7B2",
    "schedule": "#EECA3B",
    "checkpoint": "#FF9DA6",
    "step": "#DDDDDD",
    "torch op": "#9ECAE9",
    "launch": "#D3D3D3",
    "offload": "#8CD17D",
    "emulated": "#C9C9C9",
    "restart": "#D67195",
    "data": "#A0CBE8",
}
#: memory categories, in the recorder's order
MEMORY_COLORS = dict(
    zip(
        MEMORY_CATEGORIES,
        (
            "#4C78A8",
            "#F58518",
            "#54A24B",
            "#E45756",
            "#EECA3B",
            "#FF9DA6",
            "#72B7B2",
            "#B279A2",
            "#BAB0AC",
        ),
        strict=True,
    )
)
#: ranks or groups told apart (tensor-parallel shards, data-parallel replicas)
SERIES_COLORS = [
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#B279A2",
    "#EECA3B",
    "#9D755D",
]
UNKNOWN = "#888888"


def span_color(kind: str) -> str:
    """The kind's colour; an asynchronous operation of a kind without its own entry ('x in flight') takes
    the in-flight collective's."""
    if kind not in SPAN_COLORS and kind.endswith(" in flight"):
        return SPAN_COLORS["collective in flight"]
    return SPAN_COLORS.get(kind, UNKNOWN)
