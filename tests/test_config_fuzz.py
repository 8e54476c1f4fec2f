"""Bad inputs by the thousand (hypothesis): RunConfigs drawn over every field — the model's dims, the grid,
schedules, precision, ZeRO, cp, ep, data, faults, the measure schedule, odd and extreme values — either
validate or raise ConfigError before any process starts, its message naming a field; anything else (a
TypeError, a ZeroDivisionError, a KeyError from deep inside) is a failure. Valid ones drawn from the
strategies that train the dense model are launched, and train what one process trains.

`make test` draws 60 configurations and launches 2; `make test-all` (the `slow` cases) 600 and 24. Every
failure hypothesis found became a fixed case (the `@example`s below).
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, ModelConfig, RunConfig
from workbench.config import PRESETS

FIELDS = {f.name for f in dataclasses.fields(RunConfig)} | {
    f"model.{f.name}" for f in dataclasses.fields(ModelConfig)
}
ODD_INTS = st.one_of(
    st.integers(-3, 9), st.sampled_from([0, 1, 2, 3, 4, 7, 16, 64, 10**9, -(10**9)])
)
ODD_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, 1e-12, 1e30])
)


def model_changes() -> st.SearchStrategy:
    dims = st.fixed_dictionaries(
        {},
        optional={
            "base": st.sampled_from([*PRESETS, "huge"]),
            "layers": ODD_INTS,
            "hidden": ODD_INTS,
            "heads": ODD_INTS,
            "seq_len": ODD_INTS,
            "vocab_size": ODD_INTS,
            "mlp_ratio": ODD_INTS,
            "experts": ODD_INTS,
            "top_k": ODD_INTS,
            "router": st.sampled_from(["softmax", "sigmoid", "argmax"]),
            "hiden": ODD_INTS,
            "kv_heads": ODD_INTS,
            "ffn_hidden": ODD_INTS,
            "norm": st.sampled_from(["layernorm", "rmsnorm", "batchnorm"]),
            "mlp": st.sampled_from(["gelu", "swiglu", "relu"]),
            "positions": st.sampled_from(["learned", "rope", "alibi"]),
            "bias": st.booleans(),
            "tie_embeddings": st.booleans(),
            "rope_theta": ODD_FLOATS,
        },
    )
    return st.one_of(st.sampled_from([*PRESETS, "bogus"]), dims)


def settings_of_every_field() -> st.SearchStrategy:
    """Keyword arguments of RunConfig: each field left out, a plausible value, or an odd one."""
    words = {
        "schedule": [
            "gpipe",
            "1f1b",
            "interleaved",
            "zbh1",
            "zbv",
            "csv:/nonexistent.csv",
            "zigzag",
        ],
        "precision": ["fp32", "bf16", "fp16", "fp8"],
        "recompute": ["none", "selective", "full", "half"],
        "backend": ["auto", "gloo", "nccl", "tcp"],
        "allreduce": ["backend", "ring", "hierarchical", "tree"],
        "dp_impl": ["bucketed", "naive", "fancy"],
        "grad_compression": ["none", "bf16", "fp16", "int8"],
        "grad_reduce_dtype": ["fp32", "bf16", "fp16"],
        "optimizer": ["adamw", "onebit-adam", "lamb"],
        "lr_schedule": ["constant", "cosine", "linear"],
        "attention": ["eager", "sdpa", "flash"],
        "cp_balance": ["head-tail", "none", "zigzag"],
        "cp_rotate": ["ring", "allgather", "tree"],
        "moe_dispatch": ["dropless", "capacity", "random"],
        "data": ["synthetic", "/nonexistent.bin", "text:"],
        "measure": ["auto", "all", "none", "1:3", "3:1", "0:99", "x"],
        "fault": [
            None,
            "raise",
            "overflow",
            "nan-grad",
            "nan-params",
            "loss-spike",
            "straggle",
            "meteor",
        ],
        "profile_steps": [None, "0:1", "1:0", "a:b"],
        "emulate_link": [None, "inter=1,10", "inter=0,1", "x"],
    }
    ints = [
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "zero",
        "microbatches",
        "virtual_stages",
        "global_batch",
        "steps",
        "seed",
        "warmup_steps",
        "onebit_warmup_steps",
        "ranks_per_node",
        "gpu_health_every",
        "warmup_steps_excluded",
        "profile_memory_step",
        "checkpoint_every",
        "keep_checkpoints",
        "max_restarts",
        "fault_rank",
        "fault_step",
        "loss_scale_growth_interval",
        "max_skipped_steps",
    ]
    floats = [
        "lr",
        "min_lr_ratio",
        "weight_decay",
        "bucket_mb",
        "capacity_factor",
        "aux_loss_coef",
        "router_bias_rate",
        "loss_scale_init",
        "timeout_s",
        "fault_delay_s",
        "loss_spike_factor",
        "adam_beta1",
        "adam_beta2",
        "adam_eps",
    ]
    bools = [
        "sequence_parallel",
        "prefetch",
        "offload_optimizer",
        "trace",
        "compile",
        "tensorboard",
        "nsys",
        "profile_memory",
        "elastic",
        "decay_embeddings",
    ]
    optional = {name: st.sampled_from(values) for name, values in words.items()}
    optional |= {name: ODD_INTS for name in ints} | {name: ODD_FLOATS for name in floats}
    optional |= {name: st.booleans() for name in bools}
    optional |= {"model": model_changes(), "grad_clip": st.one_of(st.none(), ODD_FLOATS)}
    return st.fixed_dictionaries({}, optional=optional)


def names_a_field(message: str) -> bool:
    return any(
        f"{name}=" in message or f"{name} " in message or f"{name}:" in message for name in FIELDS
    )


def check(kwargs: dict) -> RunConfig | None:
    """The property: a RunConfig either validates, or raises ConfigError naming a field."""
    try:
        config = RunConfig(**kwargs)
        return config.validate()
    except ConfigError as e:
        assert names_a_field(str(e)), f"{kwargs}: {e}"
        return None


@pytest.mark.parametrize("examples", [60, pytest.param(600, marks=pytest.mark.slow)])
def test_every_drawn_config_validates_or_names_a_field(examples):
    """…at once, too: a validation may take 2 s at most (listing the divisors of 10⁹ one by one took minutes)."""

    @settings(
        max_examples=examples,
        deadline=timedelta(seconds=2),
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(settings_of_every_field())
    @example({"lr": math.nan})
    @example({"model": {"heads": 0}})
    @example({"model": {"base": "tiny", "heads": 3}, "tp": 2})
    @example({"cp": 2, "model": {"seq_len": 3}})
    @example({"ep": 2, "dp": 2, "model": "tiny-moe", "global_batch": 3})
    @example({"pp": 3, "schedule": "zbv", "model": {"layers": 5}})
    @example({"zero": 3, "dp": 2, "microbatches": 2})
    @example({"measure": "3:1"})
    @example({"min_lr_ratio": math.inf})
    @example({"dp": 3, "global_batch": 10**9})
    @example({"tp": 3, "model": {"hidden": 10**9, "heads": 10**9}})
    def run(kwargs: dict) -> None:
        check(kwargs)

    run()


#: the space of configs that train the dense model and equal one process in fp32 (tests/test_*.py's oracle)
TRAINABLE = st.fixed_dictionaries(
    {
        "dp": st.sampled_from([1, 2]),
        "tp": st.sampled_from([1, 2]),
        "pp": st.sampled_from([1, 2]),
        "cp": st.sampled_from([1, 2]),
        "zero": st.sampled_from([0, 1, 2, 3]),
        "microbatches": st.sampled_from([1, 2, 4]),
        "schedule": st.sampled_from(["gpipe", "1f1b", "interleaved", "zbh1"]),
        "virtual_stages": st.sampled_from([1, 2]),
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "sequence_parallel": st.booleans(),
        "bucket_mb": st.sampled_from([0.01, 25.0]),
        "allreduce": st.sampled_from(["backend", "ring"]),
        "dp_impl": st.sampled_from(["bucketed", "naive"]),
        "cp_balance": st.sampled_from(["head-tail", "none"]),
        "measure": st.sampled_from(["auto", "none", "1:2"]),
    }
)


@pytest.mark.parametrize("examples", [2, pytest.param(24, marks=pytest.mark.slow)])
def test_drawn_valid_configs_train_what_one_process_trains(examples, launched):
    model = {"base": "tiny", "layers": 4}
    twin = launched(model=model, steps=3, global_batch=8)

    @settings(
        max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    @given(TRAINABLE)
    def run(grid: dict) -> None:
        config = check({**grid, "model": model, "steps": 3, "global_batch": 8})
        assume(config is not None and 1 < config.world_size <= 4)
        assert_same_training(
            launched(**config.replace(model=model).to_dict() | {"model": model}), twin
        )

    run()
