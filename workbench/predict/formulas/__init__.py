"""The analytic predictions the workbench puts beside every measurement (docs/formulas.md).

Plain arithmetic, no torch: the notebooks, the summary writer and the estimator all call these.
Symbols: Ψ parameters, N data-parallel degree, p stages, m microbatches, v chunks per rank,
s sequence length, b microbatch size, h hidden size, a heads, L layers, V vocabulary.

    memory.py        model states per ZeRO stage and precision, parameters per rank, ZeRO's buffers
    activations.py   what our GPT saves for backward, with recomputation and release in backward
    comm.py          bytes per step (data and tensor parallel), the pipeline bubble
    flops.py         model FLOPs per token (6·N + 12·L·s·h, embeddings' lookups and idle experts left out), MFU
    context_parallel.py  the ring's K/V bytes and each rank's share of the causal attention work
    expert_parallel.py   the MoE dispatch's bytes, expert parameters ÷ ep, imbalance from router counts
    analysis/run.py           a run's predicted memory and bytes per step, from its config
    faults.py        how often to checkpoint (Young/Daly) and what failures cost
    zero_bubble.py   the zero-bubble schedules' bubble rates and weight-gradient stash; DualPipe's
                     bubble (DeepSeek's formula) and memory per rank beside the paper's table
"""

from workbench.predict.formulas.activations import (
    activation_bytes,
    activation_bytes_per_layer,
    backward_extra_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    korthikanti_activation_bytes_per_layer,
    loss_bytes,
    recompute_activation_bytes,
    stage_activation_bytes,
)
from workbench.predict.formulas.comm import (
    bubble_fraction,
    dp_bytes_per_step,
    dp_link_bytes,
    node_link_bytes,
    onebit_bytes_per_step,
    tp_comm_bytes_per_step,
)
from workbench.predict.formulas.context_parallel import (
    cp_comm_bytes_per_step,
    kv_block_bytes,
    ring_bytes_per_layer,
    unmasked_pairs_per_rank,
)
from workbench.predict.formulas.expert_parallel import (
    capacity,
    dispatch_bytes_per_layer,
    expert_imbalance,
    expert_params_per_layer,
)
from workbench.predict.formulas.faults import checkpoint_overhead, young_daly_interval
from workbench.predict.formulas.flops import active_params, mfu, model_flops_per_token
from workbench.predict.formulas.memory import (
    STATE_BYTES,
    ZERO_IN_FLIGHT,
    buffer_bytes,
    model_state_bytes,
    offload_host_bytes,
    params_per_rank,
    placement_of,
    stage_params,
)
from workbench.predict.formulas.run import (
    cp_local,
    predicted_bytes,
    predicted_comm_bytes,
    predicted_host_bytes,
    predicted_memory,
    predicted_peak,
    predicted_total,
    run_model,
    run_schedule,
)
from workbench.predict.formulas.zero_bubble import (
    RATES,
    PipelineMemory,
    bubble_rate,
    deepseek_memory,
    dualpipe_bubble,
    dualpipe_rate,
    named_bubble_fraction,
    schedule_bubble_fraction,
    wgrad_stash_bytes,
)

__all__ = [
    "RATES",
    "STATE_BYTES",
    "ZERO_IN_FLIGHT",
    "activation_bytes",
    "activation_bytes_per_layer",
    "backward_extra_bytes",
    "bubble_fraction",
    "buffer_bytes",
    "checkpoint_overhead",
    "dp_bytes_per_step",
    "dp_link_bytes",
    "node_link_bytes",
    "embedding_activation_bytes",
    "head_activation_bytes",
    "korthikanti_activation_bytes_per_layer",
    "model_state_bytes",
    "offload_host_bytes",
    "onebit_bytes_per_step",
    "params_per_rank",
    "predicted_bytes",
    "predicted_memory",
    "predicted_peak",
    "predicted_total",
    "loss_bytes",
    "predicted_comm_bytes",
    "predicted_host_bytes",
    "recompute_activation_bytes",
    "run_model",
    "run_schedule",
    "stage_activation_bytes",
    "stage_params",
    "tp_comm_bytes_per_step",
    "active_params",
    "mfu",
    "model_flops_per_token",
    "young_daly_interval",
    "bubble_rate",
    "deepseek_memory",
    "dualpipe_bubble",
    "dualpipe_rate",
    "PipelineMemory",
    "placement_of",
    "named_bubble_fraction",
    "schedule_bubble_fraction",
    "wgrad_stash_bytes",
    "cp_comm_bytes_per_step",
    "cp_local",
    "kv_block_bytes",
    "ring_bytes_per_layer",
    "unmasked_pairs_per_rank",
    "capacity",
    "dispatch_bytes_per_layer",
    "expert_imbalance",
    "expert_params_per_layer",
]
