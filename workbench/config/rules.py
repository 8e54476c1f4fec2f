"""Rules of RunConfig, by subject: every numeric field's range (`NUMERIC`), communication (hierarchical
all-reduce, emulated links), the optimizer (1-bit Adam's conditions), elastic membership, ZeRO's combinations,
the data and the profiling tools, context and expert parallelism, compilation, which steps are measured.
`RunConfig.validate` calls them; each raises ConfigError naming the bad value and what would be valid.
(The pipeline's rules are pipeline_rules.py's, the model's model_config.py's.)"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from workbench.config.data_spec import check_data
from workbench.config.grid import RankGrid, node_groups
from workbench.config.links import parse_links
from workbench.config.model_config import ConfigError, divisors
from workbench.config.pipeline_rules import splits_backward

if TYPE_CHECKING:  # the rules take the RunConfig whose validate() calls them
    from workbench.config.run_config import RunConfig

OPTIMIZERS = ("adamw", "onebit-adam")
ATTENTION = ("eager", "sdpa")


def check_communication(cfg: RunConfig) -> None:
    world = cfg.world_size
    if cfg.ranks_per_node < 0 or (cfg.ranks_per_node and world % cfg.ranks_per_node):
        valid = divisors(world)
        raise ConfigError(
            f"ranks_per_node={cfg.ranks_per_node}: the emulated machines must split the {world} "
            f"ranks evenly; valid: {valid} (0: the real machine's)"
        )
    if cfg.node_placement != "block" and (
        not cfg.ranks_per_node or cfg.allreduce == "hierarchical"
    ):
        raise ConfigError(
            f"node_placement={cfg.node_placement!r} places ranks on machines of ranks_per_node ranks: it "
            "needs emulate_link and ranks_per_node ≥ 1 (emulated machines), or ranks_per_node ≥ 1 on "
            "several real nodes (launching: a multi-node run), and the hierarchical all-reduce splits dp "
            "groups by consecutive ranks; valid here: 'block'"
        )
    if cfg.allreduce == "hierarchical" and cfg.ranks_per_node:
        try:
            node_groups(RankGrid(dp=cfg.dp, tp=cfg.tp, pp=cfg.pp), cfg.ranks_per_node)
        except ValueError as e:
            raise ConfigError(
                f"allreduce='hierarchical' with ranks_per_node={cfg.ranks_per_node}: {e}"
            ) from None
    if cfg.emulate_link is not None:
        try:
            parse_links(cfg.emulate_link)
        except ValueError as e:
            raise ConfigError(str(e)) from None


#: every numeric field's valid range: (lowest, highest, whether the lowest itself is allowed, what it means)
NUMERIC = {
    "lr": (0.0, None, False, "the peak learning rate"),
    "weight_decay": (0.0, None, True, "AdamW's decoupled weight decay"),
    "min_lr_ratio": (0.0, 1.0, True, "the cosine schedule's floor, a fraction of lr"),
    "adam_beta1": (0.0, 1.0, True, "AdamW's β1 (1 itself would never update the momentum)"),
    "adam_beta2": (0.0, 1.0, True, "AdamW's β2 (1 itself divides the bias correction by 0)"),
    "adam_eps": (0.0, None, False, "AdamW's ε"),
    "grad_clip": (0.0, None, False, "the gradient norm clipped to (None: no clipping)"),
    "bucket_mb": (0.0, None, False, "megabytes per gradient bucket"),
    "timeout_s": (0.0, None, False, "seconds before a stuck collective ends the run"),
    "loss_scale_init": (0.0, None, False, "fp16's first loss scale"),
    "loss_scale_growth_interval": (1, None, True, "good steps before fp16's scale doubles"),
    "capacity_factor": (0.0, None, False, "the experts' capacity, a multiple of an even share"),
    "aux_loss_coef": (0.0, None, True, "the Switch load-balancing loss's coefficient"),
    "router_bias_rate": (0.0, None, True, "the aux-loss-free bias's step"),
    "fault_delay_s": (0.0, None, True, "a straggler's sleep each step"),
    "fault_step": (0, None, True, "the step a fault is injected at"),
    "seed": (0, None, True, "the model's and the data's seed"),
    "eval_every": (0, None, True, "steps between validation losses (0: never)"),
    "eval_batches": (1, None, True, "held-out batches a validation averages over"),
    "ranks_per_node": (0, None, True, "ranks per emulated machine (0: the real machine's)"),
    "gpu_health_every": (0, None, True, "steps between NVML reads (0: never)"),
    "checkpoint_every": (0, None, True, "steps between checkpoints (0: never)"),
    "keep_checkpoints": (0, None, True, "checkpoints kept (0: all)"),
    "max_restarts": (0, None, True, "torchrun's restarts after a failure"),
    "loss_spike_factor": (0.0, None, True, "a skipped step's loss over the recent median (0: off)"),
    "warmup_steps_excluded": (0, None, True, "first steps the summary's times leave out"),
    "profile_memory_step": (0, None, True, "the step the memory profile ends at"),
    "onebit_warmup_steps": (0, None, True, "1-bit Adam's AdamW steps first"),
    "max_skipped_steps": (
        0,
        None,
        True,
        "skipped updates in a row before the run stops (0: never)",
    ),
}


def check_limits(cfg: RunConfig) -> None:
    """Every numeric field a number — finite, an integer where it counts — in its range (`NUMERIC`): a ConfigError
    naming the field, the value and the range. `lr=nan` and `lr=-1` stop here, before anything starts."""
    for name, (low, high, inclusive, meaning) in NUMERIC.items():
        value = getattr(cfg, name)
        if value is None and name == "grad_clip":
            continue
        integral = isinstance(low, int)
        kind = "an integer" if integral else "a finite number"
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (not integral or float(value).is_integer())
        )
        above = "≥" if inclusive else ">"
        ok = ok and (value >= low if inclusive else value > low) and (high is None or value <= high)
        if not ok:
            span = f"{above} {low}" + (f" and ≤ {high}" if high is not None else "")
            raise ConfigError(f"{name}={value!r}: {meaning} must be {kind} {span}")
    for name in ("adam_beta1", "adam_beta2"):
        if getattr(cfg, name) == 1.0:
            raise ConfigError(
                f"{name}=1.0: AdamW's betas must be below 1 (try 0.9 for β1, 0.95 or 0.999 for β2)"
            )


def check_compile(cfg: RunConfig) -> None:
    """compile=True compiles each transformer block whole (engine/compiled.py), so nothing inside a block may
    communicate, trace or count: what does is refused by name."""
    if not cfg.compile:
        return
    inside = {
        "tp": (cfg.tp > 1, "tp=1 (its collectives sit inside the blocks)"),
        "cp": (cfg.cp > 1, "cp=1 (the ring attention's transfers sit inside the blocks)"),
        "model.experts": (
            cfg.model_config.experts > 0,
            "a dense model (the router counts tokens in Python)",
        ),
        "zero": (
            cfg.zero == 3,
            "zero 0, 1 or 2 (ZeRO-3 gathers each block's parameters in its hooks)",
        ),
        "recompute": (
            cfg.recompute != "none",
            "recompute='none' (a recomputed block reruns under our traced autograd function)",
        ),
        "schedule": (
            splits_backward(cfg),
            "a schedule without the zero-bubble split (its Linears stash inputs for W)",
        ),
    }
    for key, (bad, valid) in inside.items():
        if bad:
            value = cfg.model_config.experts if key == "model.experts" else getattr(cfg, key)
            raise ConfigError(
                f"compile=True with {key}={value!r}: a compiled block must not communicate or "
                f"trace inside; valid: {valid}"
            )


def check_optimizer(cfg: RunConfig) -> None:
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer={cfg.optimizer!r}: valid optimizers are {list(OPTIMIZERS)}")
    if cfg.optimizer != "onebit-adam":
        return
    if not 1 <= cfg.onebit_warmup_steps < cfg.steps:
        raise ConfigError(
            f"onebit_warmup_steps={cfg.onebit_warmup_steps}: 1-bit Adam needs a warm-up of at least one "
            f"step, shorter than the run (steps={cfg.steps}), to freeze Adam's variance"
        )
    plain = {
        "tp": 1,
        "pp": 1,
        "zero": 0,
        "precision": "fp32",
        "dp_impl": "bucketed",
        "allreduce": "backend",
        "grad_compression": "none",
        "checkpoint_every": 0,
        "resume": None,
    }
    bad = {k: getattr(cfg, k) for k, v in plain.items() if getattr(cfg, k) != v}
    if bad:
        raise ConfigError(
            f"optimizer='onebit-adam' is built for fp32 data parallelism without checkpoints; "
            f"these settings would need {plain}: {bad}"
        )


def check_elastic(cfg: RunConfig) -> None:
    if cfg.elastic and (cfg.checkpoint_every < 1 or cfg.max_restarts < 1):
        raise ConfigError(
            f"elastic=True needs checkpoint_every ≥ 1 (got {cfg.checkpoint_every}) and max_restarts ≥ 1 "
            f"(got {cfg.max_restarts}): a group re-formed after a machine left resumes from the newest "
            f"checkpoint, and the leaving counts as one of torchrun's restarts"
        )


def check_zero(cfg: RunConfig) -> None:
    if cfg.offload_optimizer and cfg.zero == 0:
        raise ConfigError(
            "offload_optimizer=True needs ZeRO (zero=1, 2 or 3): it offloads the partitioned "
            "optimizer states"
        )
    if cfg.zero and cfg.precision != "fp32":
        raise ConfigError(
            f"zero={cfg.zero} with precision={cfg.precision!r} is not supported yet: ZeRO runs "
            f"in fp32 here (use precision='fp32', or zero=0 for mixed precision)"
        )
    if cfg.zero == 0:
        return
    if cfg.tp > 1:
        raise ConfigError(
            f"zero={cfg.zero} with tp={cfg.tp} is not supported yet: ZeRO partitions over the "
            f"data-parallel ranks of a model without tensor parallelism (use tp=1)"
        )
    if cfg.zero == 3 and cfg.microbatches > 1:
        raise ConfigError(
            "zero=3 with microbatches > 1 is not supported: parameters would be gathered per "
            "microbatch; use zero=1 or 2 for gradient accumulation"
        )
    if cfg.zero >= 2 and cfg.pp > 1:
        raise ConfigError(
            f"zero={cfg.zero} with pp={cfg.pp} is not supported (gradients would be partitioned "
            f"once per microbatch); ZeRO-1 composes with pipeline parallelism: use zero=1"
        )
    if cfg.zero and (
        cfg.dp_impl == "naive"
        or cfg.allreduce not in ("backend", "ring")
        or cfg.allreduce == "ring"
        and cfg.zero != 1
    ):
        raise ConfigError(
            "ZeRO brings its own reduce-scatter and all-gather: use dp_impl='bucketed' and "
            "allreduce='backend' (or 'ring' with zero=1: our send/recv rings for both)"
        )


def check_tied_embeddings(cfg: RunConfig) -> None:
    """A head tied to the token table is one parameter used at both ends of the model: the first and last
    pipeline stages would each hold a copy whose gradients must be summed (Megatron's embedding group), and
    ZeRO-3 would gather it as two units. Neither is built here: refused, naming what runs."""
    if not cfg.model_config.tie_embeddings:
        return
    for key, bad, valid in (("pp", cfg.pp > 1, "pp=1"), ("zero", cfg.zero == 3, "zero 0, 1 or 2")):
        if bad:
            raise ConfigError(
                f"model.tie_embeddings=True with {key}={getattr(cfg, key)}: the tied head and "
                f"token table are one parameter at both ends of the model, which this engine does "
                f"not split; valid: {valid}, or model.tie_embeddings=False"
            )


def check_data_and_tools(cfg: RunConfig) -> None:
    """The data file (config/data_spec.py), the attention kernel, and torch.profiler's step range."""
    if cfg.attention not in ATTENTION:
        raise ConfigError(f"attention={cfg.attention!r}: valid are {list(ATTENTION)}")
    if cfg.attention == "sdpa" and cfg.recompute != "none":
        raise ConfigError(
            f"attention='sdpa' with recompute={cfg.recompute!r}: the fused kernel already recomputes "
            f"the attention core in its backward (no s×s probabilities kept); its memory with "
            f"recomputation is not modelled yet — use recompute='none'"
        )
    m = cfg.model_config
    check_data(cfg.data, m.vocab_size, m.seq_len, cfg.val_data, evaluating=cfg.eval_every > 0)
    if cfg.wandb is not None:
        import importlib.util

        if not cfg.wandb.strip():
            raise ConfigError("wandb='': name a W&B project (or leave wandb unset)")
        if importlib.util.find_spec("wandb") is None:
            raise ConfigError(
                f"wandb={cfg.wandb!r}: the wandb package is not installed here; pip install wandb "
                f"(or `pip install workbench[wandb]`), or leave --wandb off"
            )
    if cfg.profile_steps is None:
        return
    first, stop = profile_range(cfg.profile_steps)
    if not 0 <= first < stop <= cfg.steps:
        raise ConfigError(
            f"profile_steps={cfg.profile_steps!r}: steps A..B−1 with 0 ≤ A < B ≤ steps={cfg.steps}, "
            f"e.g. '2:4'"
        )
    if cfg.profile_memory:
        raise ConfigError(
            "profile_steps and profile_memory both run torch.profiler: choose one per run"
        )


def profile_range(spec: str) -> tuple[int, int]:
    """'A:B' → (A, B); ConfigError when it is not two integers."""
    try:
        first, stop = (int(x) for x in str(spec).split(":"))
    except ValueError:
        raise ConfigError(
            f"profile_steps={spec!r}: give 'A:B', the first profiled step and the one after the "
            f"last, e.g. '2:4'"
        ) from None
    return first, stop


CP_BALANCES = ("head-tail", "none")
CP_ROTATIONS = ("ring", "allgather")


def check_context_parallel(cfg: RunConfig) -> None:
    """cp: the sequence must split into 2·cp chunks (head-tail) or cp (none), and each rank's s/cp tokens
    over tp under sequence parallelism. cp > 1 runs its own ring attention (so not attention='sdpa'); its
    gradients reduce over the dp×cp group, which 1-bit Adam's and the hierarchical all-reduce's dp-only
    groups do not know."""
    if cfg.cp_balance not in CP_BALANCES:
        raise ConfigError(f"cp_balance={cfg.cp_balance!r}: valid are {', '.join(CP_BALANCES)}")
    if cfg.cp_rotate not in CP_ROTATIONS:
        raise ConfigError(f"cp_rotate={cfg.cp_rotate!r}: valid are {', '.join(CP_ROTATIONS)}")
    if cfg.cp == 1:
        return
    chunks = 2 * cfg.cp if cfg.cp_balance == "head-tail" else cfg.cp
    seq = cfg.model_config.seq_len
    if seq % chunks:
        raise ConfigError(
            f"cp={cfg.cp} with cp_balance={cfg.cp_balance!r} cuts the sequence into {chunks} chunks: "
            f"model.seq_len={seq} must be a multiple of {chunks}"
        )
    if cfg.sequence_parallel and (seq // cfg.cp) % cfg.tp:
        raise ConfigError(
            f"cp={cfg.cp} with sequence_parallel and tp={cfg.tp}: each rank's {seq // cfg.cp} tokens "
            f"must split over tp; make model.seq_len a multiple of {chunks * cfg.tp}"
        )
    clash = {
        "attention": ("sdpa", "'eager' (cp runs its own ring attention)"),
        "optimizer": ("onebit-adam", "'adamw' (1-bit Adam compresses over dp only)"),
        "allreduce": (
            "hierarchical",
            "'backend' or 'ring' (the machine split is of dp groups only)",
        ),
    }
    for key, (bad, valid) in clash.items():
        if getattr(cfg, key) == bad:
            raise ConfigError(
                f"cp={cfg.cp} with {key}={bad!r}: valid with context parallelism is {key}={valid}"
            )


MOE_DISPATCH = ("dropless", "capacity")


def check_experts(cfg: RunConfig) -> None:
    """A mixture of experts (model.experts > 0) and its expert parallelism: ep divides dp (its groups are
    carved from dp) and the experts; dispatch is 'dropless' or 'capacity' (capacity_factor > 0). What the
    MoE layers do not compose with yet is refused by name: tensor parallelism (experts are whole), context
    parallelism, recomputation (a rerun router would count its tokens twice), 1-bit Adam, and with ep > 1
    ZeRO-3 and offload (ZeRO-1/2 cut dense slices over dp, experts' over edp), 16-bit precision, naive DP
    and compressed buckets."""
    m = cfg.model_config
    if cfg.moe_dispatch not in MOE_DISPATCH:
        raise ConfigError(f"moe_dispatch={cfg.moe_dispatch!r}: valid are {', '.join(MOE_DISPATCH)}")
    if cfg.capacity_factor <= 0 or cfg.aux_loss_coef < 0 or cfg.router_bias_rate < 0:
        raise ConfigError(
            f"capacity_factor={cfg.capacity_factor} must be > 0, aux_loss_coef={cfg.aux_loss_coef} "
            f"and router_bias_rate={cfg.router_bias_rate} ≥ 0"
        )
    if not m.experts:
        if cfg.ep > 1:
            raise ConfigError(
                f"ep={cfg.ep} shards experts, and the model has none: use a model with experts "
                f"(model.experts > 0, e.g. model='tiny-moe')"
            )
        return
    if cfg.dp % cfg.ep or m.experts % cfg.ep:
        valid = divisors(cfg.dp, also=m.experts)
        raise ConfigError(
            f"ep={cfg.ep} must divide dp={cfg.dp} (expert-parallel groups are carved from data "
            f"parallelism) and model.experts={m.experts}; valid ep: {valid}"
        )
    clash = {
        "tp": (cfg.tp > 1, "tp=1"),
        "cp": (cfg.cp > 1, "cp=1"),
        "recompute": (cfg.recompute != "none", "recompute='none'"),
        "zero": (cfg.zero == 3 and cfg.ep > 1, "zero 0, 1 or 2 with ep > 1"),
        "offload_optimizer": (cfg.offload_optimizer and cfg.ep > 1, "no offload with ep > 1"),
        "optimizer": (cfg.optimizer != "adamw", "optimizer='adamw'"),
        "precision": (cfg.precision != "fp32" and cfg.ep > 1, "precision='fp32' with ep > 1"),
        "dp_impl": (cfg.dp_impl != "bucketed" and cfg.ep > 1, "dp_impl='bucketed' with ep > 1"),
        "grad_compression": (
            cfg.grad_compression != "none" and cfg.ep > 1,
            "grad_compression='none' with ep > 1",
        ),
    }
    for key, (bad, instead) in clash.items():
        if bad:
            raise ConfigError(
                f"model.experts={m.experts} with {key}={getattr(cfg, key)!r}: the MoE layers do not "
                f"compose with it yet; valid: {instead}"
            )


def parse_measure(spec: str, steps: int) -> tuple[int, int] | None:
    """'all' | 'none' | 'A:B' → (first, stop); None for 'auto' (resolved on the rank, which knows its device).
    ConfigError naming the value and what would be valid."""
    if spec == "auto":
        return None
    if spec == "all":
        return 0, steps
    if spec == "none":
        return 0, 0
    try:
        first, stop = (int(x) for x in str(spec).split(":"))
    except ValueError:
        raise ConfigError(
            f"measure={spec!r}: valid are 'auto', 'all', 'none' or 'A:B' (steps A..B−1 measured, "
            f"the others fast), e.g. '2:5'"
        ) from None
    if not 0 <= first <= stop <= steps:
        raise ConfigError(
            f"measure={spec!r}: 'A:B' measures steps A..B−1, with 0 ≤ A ≤ B ≤ steps={steps} "
            f"(e.g. '2:5'); or 'auto', 'all', 'none'"
        )
    return first, stop
