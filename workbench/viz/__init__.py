"""Charts of run directories (plotly). Reads Runs and DataFrames only: never imports torch (but
`torch_grid`, which asks torch's own pipeline visualizer, lazily)."""

from workbench.viz.check import check, headroom
from workbench.viz.context_parallel import (
    activations_vs_cp,
    attention_work,
    ring_blocks,
    ring_replay,
)
from workbench.viz.layout import layout_table, rank_layout
from workbench.viz.loss import compare_losses, loss_curves
from workbench.viz.memory import memory_breakdown, memory_over_time
from workbench.viz.pipeline import bubble_vs_m, planned, planned_vs_measured
from workbench.viz.predict import predict
from workbench.viz.ring import ring_all_reduces, ring_steps
from workbench.viz.tensor_parallel import shard_table, tp_shards
from workbench.viz.timeline import overlap_table, timeline
from workbench.viz.zero import formula_figure, stages_side_by_side
from workbench.viz.zero_bubble import side_by_side as schedules_side_by_side
from workbench.viz.zero_bubble import stash_over_time, torch_grid, w_deferral

__all__ = [
    "activations_vs_cp",
    "attention_work",
    "layout_table",
    "rank_layout",
    "ring_blocks",
    "ring_replay",
    "bubble_vs_m",
    "check",
    "headroom",
    "compare_losses",
    "loss_curves",
    "memory_breakdown",
    "memory_over_time",
    "overlap_table",
    "predict",
    "formula_figure",
    "planned",
    "planned_vs_measured",
    "stages_side_by_side",
    "ring_all_reduces",
    "ring_steps",
    "schedules_side_by_side",
    "shard_table",
    "stash_over_time",
    "timeline",
    "torch_grid",
    "tp_shards",
    "w_deferral",
]
