"""The run configuration: one typed, validated object that every process and every reader shares.

A `RunConfig` is built in the launcher (Python, Jupyter or CLI) and validated once, at the door, *before
any process starts*: `validate()` returns a `ValidConfig`, the same frozen fields with the proof that the
rules held. The launcher, compare and the elastic command line take a ValidConfig as it is (`validated`
validates only a plain RunConfig); it is written to the run directory as JSON and read back by every
rank. It holds every grid dimension the project has — including the ones whose engines have not landed
yet, which `validate()` rejects by name so that a user learns what is missing instead of getting a
silent single-process run.

This module imports no torch: the launcher, the CLI and the notebooks validate without it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from workbench.config.model_config import PRESETS as PRESETS
from workbench.config.model_config import ConfigError as ConfigError
from workbench.config.model_config import ModelConfig as ModelConfig
from workbench.config.model_config import check_tensor_parallel, divisors, model_from_dict
from workbench.config.pipeline_rules import SCHEDULES as SCHEDULES
from workbench.config.pipeline_rules import TWO_STAGES, check_pipeline, check_schedule_name
from workbench.config.rules import (
    check_communication,
    check_compile,
    check_context_parallel,
    check_data_and_tools,
    check_elastic,
    check_experts,
    check_limits,
    check_optimizer,
    check_tied_embeddings,
    check_zero,
    parse_measure,
)

PRECISIONS = ("fp32", "bf16", "fp16")
RECOMPUTE = ("none", "selective", "full")
BACKENDS = ("auto", "gloo", "nccl", "mpi", "ccl")
ALLREDUCE = ("backend", "ring", "hierarchical")
NODE_PLACEMENTS = ("block", "round-robin")
DP_IMPLS = ("bucketed", "naive")
FAULTS = ("raise", "hang", "overflow", "kill", "nan-grad", "nan-params", "loss-spike", "straggle")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one launch needs. The world size is dp × cp × tp × pp.

    Equal settings are equal configs, validated or not: `RunConfig(dp=2) == RunConfig(dp=2).validate()`.

    Grid axes follow Megatron-LM's order: tp is the fastest-varying axis of the global rank, then cp,
    then dp, then pp (see `workbench.config.grid`).
    """

    #: a preset (tiny, small, gpt2-small, gpt2-medium, gpt-1.3b; tiny-moe, small-moe, gpt2-small-moe) or changes to
    #: one, as JSON on the command line: '{"base": "small", "layers": 8}' (base tiny when left out)
    model: str | ModelConfig = "tiny"
    #: data-parallel ranks: each its share of the global batch, gradients averaged over them
    dp: int = 1
    #: tensor-parallel ranks (Megatron): each its columns or rows of every matmul
    tp: int = 1
    #: pipeline stages: each its run of layers, microbatches flowing through them (see schedule)
    pp: int = 1
    #: context-parallel ranks: each its s/cp tokens of every sequence, attention as a ring of K/V
    cp: int = 1
    #: context parallelism's split: 'head-tail' (each rank a chunk from each end: equal work) or 'none'
    cp_balance: str = "head-tail"
    #: context parallelism's K/V: 'ring' (passed round, overlapped with attention) or 'allgather' (torch's)
    cp_rotate: str = "ring"
    #: expert-parallel ranks, carved from dp: each its E/ep experts of every MoE layer (all-to-all dispatch)
    ep: int = 1
    #: 'dropless' (every assignment kept) or 'capacity' (at most capacity_factor × an even share an expert)
    moe_dispatch: str = "dropless"
    #: the experts' capacity with moe_dispatch='capacity', a multiple of an even share of the assignments
    capacity_factor: float = 1.25
    #: the Switch load-balancing loss's coefficient (0: off)
    aux_loss_coef: float = 0.01
    #: aux-loss-free balancing (DeepSeek-V3): the per-expert bias's step (0: off)
    router_bias_rate: float = 0.0
    #: ZeRO stage over dp: 1 optimizer states, 2 + gradients, 3 + parameters partitioned (0: none)
    zero: int = 0
    #: pipeline schedule: gpipe, 1f1b, interleaved, zbh1, zbv, dualpipe, dualpipev, or csv:FILE (torch
    #: pipelining's CSV: 0F0, 0I0 ...)
    schedule: str = "1f1b"
    #: microbatches a step: a pipeline's, or gradient accumulation's without one
    microbatches: int = 1
    #: pipeline chunks a rank (interleaved 1F1B; zbv is 2)
    virtual_stages: int = 1
    #: 'fp32', or 'bf16' / 'fp16': 16-bit parameters and activations, fp32 master weights
    precision: str = "fp32"
    #: fp16 dynamic loss scaling: the first scale
    loss_scale_init: float = 65536.0
    #: fp16 dynamic loss scaling: good steps in a row before the scale doubles
    loss_scale_growth_interval: int = 1000
    #: 16-bit runs: gradients accumulate and are all-reduced in 'fp32' (Megatron's main_grad) or in the
    #: parameters' 16 bits (half the bytes on the wire; fp32 copies made at the update)
    grad_reduce_dtype: str = "fp32"
    #: activation recomputation: 'none', 'selective' (the attention core) or 'full' (each block)
    recompute: str = "none"
    #: with tp > 1: the sequence split over the tp ranks outside attention and MLP (reduce-scatter/all-gather)
    sequence_parallel: bool = False
    #: sequences a step, over all dp ranks and microbatches
    global_batch: int = 16
    #: optimizer steps
    steps: int = 20
    #: the model's and the data's seed: equal seeds, equal runs
    seed: int = 0
    #: the peak learning rate (AdamW)
    lr: float = 3e-3
    #: 'constant', or 'cosine' decay to lr·min_lr_ratio; a linear warm-up of warmup_steps comes first
    lr_schedule: str = "constant"
    #: steps of linear warm-up to lr
    warmup_steps: int = 0
    #: the cosine schedule's floor, a fraction of lr
    min_lr_ratio: float = 0.1
    #: AdamW's decoupled weight decay, on the weight matrices only (norms' gains and biases never decay: nanoGPT's
    #: and Megatron-LM's groups; optim/weight_decay.py). GPT-3 and Llama train with 0.1
    weight_decay: float = 0.0
    #: whether the embedding tables decay too (they are matrices: nanoGPT and Megatron-LM decay them)
    decay_embeddings: bool = True
    #: AdamW's β1 (the momentum's decay)
    adam_beta1: float = 0.9
    #: AdamW's β2 (the second moment's decay): torch's default 0.999; GPT-2/3 and Llama train with 0.95
    adam_beta2: float = 0.999
    #: AdamW's ε (added to √v)
    adam_eps: float = 1e-8
    #: the global gradient norm clipped to (clip_grad_norm_'s); None disables (the CLI takes 0 for it too)
    grad_clip: float | None = 1.0
    #: 'auto' (NCCL where every rank has a GPU, else gloo on the CPU), 'gloo', 'nccl', 'mpi', 'ccl'
    backend: str = "auto"
    #: data parallelism's all-reduce: 'backend' (gloo's or NCCL's), 'ring' (ours, from send/recv) or
    #: 'hierarchical' (reduce-scatter inside a machine, all-reduce across, all-gather)
    allreduce: str = "backend"
    #: 'bucketed' (DDP's: buckets all-reduced as backward fills them) or 'naive' (one all-reduce a parameter)
    dp_impl: str = "bucketed"
    #: megabytes a gradient bucket
    bucket_mb: float = 25.0
    #: 'bf16' | 'fp16': buckets cast to 16 bits for the all-reduce and back (DDP's compress hooks); 'none'
    grad_compression: str = "none"
    #: a teaching device: emulated links 'inter=BW_GBps,LATENCY_us;intra=BW_GBps,LATENCY_us' between emulated
    #: machines of ranks_per_node ranks (comm/emulated_link.py)
    emulate_link: str | None = None
    #: ranks an emulated machine (0: LOCAL_WORLD_SIZE, the real machine's)
    ranks_per_node: int = 0
    #: how the machines take their ranks: 'block' (ranks_per_node consecutive ranks a machine, as torchrun
    #: numbers them: each tp group on one machine) or 'round-robin' (rank r on machine r mod machines: each tp
    #: group spread over them, as a grid in the wrong order would be) — the emulated machines, or without
    #: emulate_link the real nodes of a multi-node run (engine/context.place_rank renumbers the ranks)
    node_placement: str = "block"
    #: 'adamw', or 'onebit-adam' (1-bit Adam: AdamW for onebit_warmup_steps, then frozen variance and a
    #: momentum all-reduced in signs with error feedback; optim/onebit_adam.py)
    optimizer: str = "adamw"
    #: 1-bit Adam's AdamW steps first
    onebit_warmup_steps: int = 5
    #: ZeRO-3: gather the next layer's parameters while the current one computes
    prefetch: bool = True
    #: ZeRO-Offload (zero ≥ 1): this rank's slices of the master weights, gradients and Adam's moments in host
    #: memory, the update on the CPU (optim/offload.py); on a CPU run the same code keeps separate host copies
    offload_optimizer: bool = False
    #: record the timeline (off: nothing is recorded, every step runs fast)
    trace: bool = True
    #: steps measured (memory by category, the allocator, synchronised spans) or fast: 'auto' (every step on a
    #: CPU, three after the warm-up on a GPU), 'all', 'none', or 'A:B' (steps A..B−1); measure/schedule.py
    measure: str = "auto"
    #: torch.compile each transformer block (engine/compiled.py)
    compile: bool = False
    #: the tokens: 'synthetic' (a learnable Markov chain), a nanoGPT .bin file, or 'text:FILE' (its bytes)
    data: str = "synthetic"
    #: the held-out tokens for the validation loss, in data's form; default: nanoGPT's val.bin beside a
    #: train.bin, else the data file's last 10 % (never trained on), or the synthetic chain's held-out stream
    val_data: str | None = None
    #: the validation loss every N steps and after the last (0: never), forward only, with the run's strategy
    eval_every: int = 0
    #: held-out batches of global_batch sequences each validation averages over
    eval_batches: int = 4
    #: 'eager': attention written out (what the activation formula counts); 'sdpa': torch's fused kernel
    attention: str = "eager"
    #: rank 0 writes loss, lr, time split and memory per step into RUN/tb (engine/logs/tensorboard.py)
    tensorboard: bool = False
    #: a W&B project: rank 0 logs what tensorboard logs, the config and the summary, offline without a login
    #: (the CLI's bare --wandb: project 'workbench')
    wandb: str | None = None
    #: 'A:B': a torch.profiler (Kineto) trace of steps A..B−1 per rank in RUN/profile (measure/torch_profile.py)
    profile_steps: str | None = None
    #: CUDA ranks read their GPU through NVML every this many steps (0: never): measure/gpu_health.py
    gpu_health_every: int = 1
    #: each rank under Nsight Systems (`nsys profile -t cuda,nvtx,osrt`) into RUN/nsys/rank<r>.nsys-rep (CUDA only)
    nsys: bool = False
    #: summary.json's time figures (step time, compute, comm, overlap, idle) and the charts' default window
    #: leave out this many first steps: warm-up, where one rank starting later makes the others wait
    warmup_steps_excluded: int = 1
    #: the allocator beside the categories: CPU, torch.profiler's memory events from the start until the
    #: end of step profile_memory_step; CUDA, a memory snapshot for pytorch.org/memory_viz
    profile_memory: bool = False
    #: the step the memory profile ends at
    profile_memory_step: int = 1
    #: the process groups' timeout, seconds: a stuck collective ends the run, naming the rank and operation
    timeout_s: float = 120.0
    #: the run's name (default: its directory's)
    name: str | None = None
    #: a DCP checkpoint every N steps (0: never)
    checkpoint_every: int = 0
    #: where checkpoints go (default RUN/checkpoints)
    checkpoint_dir: str | None = None
    #: keep the newest K checkpoints (0: all)
    keep_checkpoints: int = 0
    #: resume from a checkpoint, a directory of them, or 'auto' (the newest good one, if any)
    resume: str | None = None
    #: torchrun restarts the whole group up to this many times after a rank fails; each restart resumes from
    #: the newest good checkpoint (fault tolerance: launching/worker.py)
    max_restarts: int = 0
    #: elastic membership (launch with Nodes(nnodes="MIN:MAX")): torchrun re-forms the group when a machine's
    #: agent leaves or joins; dp follows the world size it forms (dp = WORLD_SIZE / (tp·pp), `dp` above being
    #: the largest), and each new group resumes from the newest good checkpoint, resharded (engine/restart.py)
    elastic: bool = False
    #: skip a step whose global loss exceeds this × the median of the last 10 (0: off; engine/anomaly.py)
    loss_spike_factor: float = 0.0
    #: stop the run after this many skipped updates in a row (a non-finite gradient norm, a loss spike), naming
    #: the first and its likely cause; non-finite parameters stop it at once (0: never stop; engine/anomaly.py)
    max_skipped_steps: int = 3
    #: a fault injected for tests and teaching (engine/faults.py): raise, hang, kill, overflow, nan-grad,
    #: nan-params, loss-spike, straggle
    fault: str | None = None
    #: the rank a fault is injected on
    fault_rank: int = 0
    #: the step a fault is injected at
    fault_step: int = 0
    #: a straggler's sleep each step, seconds
    fault_delay_s: float = 0.25

    # ---- derived -----------------------------------------------------------------------------
    def __post_init__(self) -> None:
        if self.schedule in TWO_STAGES and self.virtual_stages == 1:  # a V, DualPipe: two per rank
            object.__setattr__(self, "virtual_stages", 2)

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def model_config(self) -> ModelConfig:
        if isinstance(self.model, ModelConfig):
            return self.model
        if isinstance(self.model, dict):
            return model_from_dict(self.model)
        if self.model not in PRESETS:
            raise ConfigError(
                f"model={self.model!r}: unknown preset; valid presets: {sorted(PRESETS)}"
            )
        return PRESETS[self.model]

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.dp

    # ---- validation --------------------------------------------------------------------------
    def validate(self) -> ValidConfig:
        """Raise ConfigError naming the first bad value and what would be valid; return the same settings as
        a ValidConfig, which the launcher, compare and the elastic command line take without checking
        again. The checks run once, in the ValidConfig's construction."""
        return ValidConfig(**self._settings())

    def _check(self) -> None:
        """Every rule, in order: the grid's sizes, each field's range and choices, then the rules that span
        several fields (config/rules.py, config/pipeline_rules.py)."""
        for name in (
            "dp",
            "tp",
            "pp",
            "cp",
            "ep",
            "microbatches",
            "virtual_stages",
            "global_batch",
            "steps",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name}={value!r}: must be a positive integer")
        check_limits(self)
        check_schedule_name(self.schedule)
        _choice("precision", self.precision, PRECISIONS)
        if self.grad_reduce_dtype not in ("fp32", self.precision):
            raise ConfigError(
                f"grad_reduce_dtype={self.grad_reduce_dtype!r} with precision={self.precision!r}: "
                f"valid are 'fp32' or the parameters' own {self.precision!r}"
            )
        _choice("recompute", self.recompute, RECOMPUTE)
        _choice("backend", self.backend, BACKENDS)
        if self.gpu_health_every < 0:
            raise ConfigError(
                f"gpu_health_every={self.gpu_health_every}: a number of steps ≥ 1, or 0 for never"
            )
        _choice("allreduce", self.allreduce, ALLREDUCE)
        _choice("node_placement", self.node_placement, NODE_PLACEMENTS)
        _choice("dp_impl", self.dp_impl, DP_IMPLS)
        _choice("grad_compression", self.grad_compression, ("none", "bf16", "fp16"))
        _choice("lr_schedule", self.lr_schedule, ("constant", "cosine"))
        if self.warmup_steps < 0 or self.warmup_steps >= self.steps and self.warmup_steps > 0:
            raise ConfigError(
                f"warmup_steps={self.warmup_steps}: must be ≥ 0 and below steps={self.steps}"
            )
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"zero={self.zero!r}: valid stages are 0, 1, 2, 3")
        if self.fault is not None:
            _choice("fault", self.fault, FAULTS)
            if not 0 <= self.fault_rank < self.world_size:
                raise ConfigError(
                    f"fault_rank={self.fault_rank}: valid ranks are 0..{self.world_size - 1}"
                )
        self.model_config.validate()
        if self.global_batch % self.dp:
            valid = divisors(self.global_batch)
            raise ConfigError(
                f"global_batch={self.global_batch} is not divisible by dp={self.dp}: each data-parallel "
                f"rank needs an equal share. Valid dp for this batch: {valid}; or choose a global batch "
                f"that is a multiple of {self.dp}"
            )
        self._validate_tensor_parallel()
        check_pipeline(self)
        check_zero(self)
        check_context_parallel(self)
        check_experts(self)
        check_tied_embeddings(self)
        if self.profile_memory and not 0 <= self.profile_memory_step < self.steps:
            raise ConfigError(
                f"profile_memory_step={self.profile_memory_step}: the profiled step must be one of the "
                f"run's steps, 0..{self.steps - 1}"
            )
        check_communication(self)
        check_optimizer(self)
        check_elastic(self)
        check_data_and_tools(self)
        parse_measure(self.measure, self.steps)
        check_compile(self)
        if self.grad_compression != "none" and (
            self.zero or self.dp_impl == "naive" or self.precision != "fp32"
        ):
            raise ConfigError(
                f"grad_compression={self.grad_compression!r} compresses fp32 gradient buckets: it needs "
                f"zero=0, dp_impl='bucketed', precision='fp32' (16-bit runs: use grad_reduce_dtype)"
            )
        if self.allreduce != "backend" and self.dp_impl == "naive":
            raise ConfigError(
                f"allreduce={self.allreduce!r} runs on gradient buckets: use dp_impl='bucketed'"
            )

    def _validate_tensor_parallel(self) -> None:
        m, t = self.model_config, self.tp
        if self.sequence_parallel and t == 1:
            raise ConfigError(
                "sequence_parallel=True needs tp > 1: it splits the sequence over the "
                "tensor-parallel ranks"
            )
        if t == 1:
            return
        check_tensor_parallel(m, t)
        if self.sequence_parallel and m.seq_len % t:
            valid = divisors(m.seq_len)
            raise ConfigError(
                f"sequence_parallel with tp={t} needs model.seq_len={m.seq_len} divisible by tp; "
                f"valid tp: {valid}"
            )

    # ---- serialisation -----------------------------------------------------------------------
    def _settings(self) -> dict[str, Any]:
        """The fields as they are (a ModelConfig stays one): what equality compares and `replace` copies."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunConfig):
            return NotImplemented
        return self._settings() == other._settings()

    def __hash__(self) -> int:
        return hash(tuple(self._settings().values()))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["model"] = (
            self.model if isinstance(self.model, str) else dataclasses.asdict(self.model_config)
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """From `to_dict()`'s output, a request.json, or a run's config.json (its resolved facts — params,
        grid, hosts ... — are left out: RESOLVED)."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k not in RESOLVED and not (k == "extra" and v == {})}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown configuration keys {unknown}; valid keys: {sorted(known)}")
        model = d.get("model")
        if isinstance(model, dict):  # config.json names the preset beside its dims
            dims = {k: v for k, v in model.items() if k != "preset"}
            d["model"] = model.get("preset") or model_from_dict(dims)
        return RunConfig(**d)  # settings read from a file are not yet validated

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def replace(self, **changes: Any) -> RunConfig:
        """These settings with `changes`: a plain RunConfig, to be validated (a ValidConfig's too)."""
        return RunConfig(**{**self._settings(), **changes})


class ValidConfig(RunConfig):
    """A RunConfig whose rules held: the same frozen fields, read the same way (`cfg.dp`,
    `cfg.model_config`), equal to the RunConfig it came from.

    Its construction runs the checks (`__post_init__`), so no ValidConfig exists whose rules did not hold:
    `RunConfig.validate()` builds one from its fields, and `ValidConfig(dp=0)` or
    `dataclasses.replace(valid, dp=0)` raise the same ConfigError that `validate()` would. `replace` gives
    back a plain RunConfig, to be validated. The launcher, compare and the elastic command line take a
    ValidConfig and check nothing again; given a plain RunConfig they validate it once (`validated`). The
    ranks validate what they read from request.json: that is their own door (launching/worker.py)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check()


def validated(config: RunConfig) -> ValidConfig:
    """`config` itself when it is a ValidConfig already, else `config.validate()`: each config is checked
    once on its way to the ranks."""
    return config if isinstance(config, ValidConfig) else config.validate()


#: what config.json adds to the request: facts of the launch, not settings
RESOLVED = (
    "params",
    "params_per_rank",
    "world_size",
    "device",
    "device_name",
    "local_batch",
    "torch_version",
    "hosts",
    "grid",
)


def _choice(name: str, value: object, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(f"{name}={value!r}: valid values are {list(valid)}")
