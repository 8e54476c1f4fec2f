"""RunLayout (predict/run_layout.py) re-declares the RunConfig fields the estimator reads, so that a run no
RunConfig describes here (175B on 1,024 GPUs) is written with the same words. These tests keep the two
in step: a field both have keeps RunConfig's name and a type RunConfig's field can hold, the layout's
own fields are the few listed below, each with what it is for, and a RunConfig estimated directly or as
its layout gives the same estimate."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest

from workbench.config import RunConfig
from workbench.predict.estimator import A100_80GB, estimate
from workbench.predict.run_layout import RunLayout, Traffic

#: the fields only a layout has, and what each is for (RunLayout's docstring says the same)
LAYOUT_ONLY = {
    "params": "the parameter count alone, for a run described without a model",
    "offload": "ZeRO-Offload: RunConfig's offload_optimizer, under the estimator's shorter name",
    "grad_bytes": "bytes a gradient value: what RunConfig's grad_reduce_dtype resolves to",
    "traffic": "how the data-parallel gradients travel: Traffic, of RunConfig's fields of its names",
    "rule": "the pipeline simulator's timing rule: RunConfig's backend when it names gloo or nccl",
    "uneven_stages": "a pp that does not divide the layers, as Llama 3's pipeline (no run does that)",
}


def _members(annotation: Any) -> set[Any]:
    """The types a field's annotation allows: `int | None` → {int, NoneType}."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation))
    return {annotation}


def _shared_types(cls: type) -> dict[str, tuple[set[Any], set[Any]]]:
    """For each field of `cls` that RunConfig also has: (the types `cls` allows, RunConfig's)."""
    ours, theirs = typing.get_type_hints(cls), typing.get_type_hints(RunConfig)
    return {
        f.name: (_members(ours[f.name]), _members(theirs[f.name]))
        for f in dataclasses.fields(cls)
        if f.name in theirs
    }


@pytest.mark.parametrize("cls", [RunLayout, Traffic])
def test_a_field_both_have_holds_what_runconfigs_holds(cls):
    """Beside None (not given: no activations, or the hardware's own), a layout's field holds only types
    RunConfig's field of the same name holds (`model`: a ModelConfig, where RunConfig also takes a
    preset's name)."""
    for name, (ours, theirs) in _shared_types(cls).items():
        assert ours - {type(None)} <= theirs, (name, ours, theirs)


def test_the_layouts_own_fields_are_the_listed_ones():
    """Every RunLayout field is RunConfig's, by name, or one of LAYOUT_ONLY; Traffic's are all
    RunConfig's. A new field named differently from RunConfig's fails here until it is listed."""
    config_fields = {f.name for f in dataclasses.fields(RunConfig)}
    layout_fields = {f.name for f in dataclasses.fields(RunLayout)}
    assert layout_fields - config_fields == set(LAYOUT_ONLY)
    assert {f.name for f in dataclasses.fields(Traffic)} <= config_fields


def test_of_copies_each_shared_field_by_its_name():
    """`RunLayout.of` reads each field both have from the RunConfig's field of that name (the model as
    its ModelConfig)."""
    config = RunConfig(
        model="small",
        dp=2,
        tp=2,
        pp=2,
        global_batch=8,
        microbatches=2,
        schedule="gpipe",
        sequence_parallel=True,
        recompute="selective",
        bucket_mb=5.0,
        prefetch=False,
        precision="bf16",
    ).validate()
    layout = RunLayout.of(config)
    for name in _shared_types(RunLayout):
        expected = config.model_config if name == "model" else getattr(config, name)
        assert getattr(layout, name) == expected, name
    for name in _shared_types(Traffic):
        assert getattr(layout.traffic, name) == getattr(config, name), name


CONFIGS = {
    "dp": RunConfig(dp=4, global_batch=8),
    "zero 1": RunConfig(dp=2, zero=1, global_batch=8),
    "zero 2": RunConfig(dp=2, zero=2, global_batch=8),
    "zero 3": RunConfig(dp=2, zero=3, global_batch=8),
    "tp + sp": RunConfig(model="small", tp=2, sequence_parallel=True, global_batch=4),
    "pp interleaved": RunConfig(
        model="small",
        pp=2,
        schedule="interleaved",
        virtual_stages=2,
        microbatches=4,
        global_batch=8,
    ),
    "cp": RunConfig(model="small", cp=2, global_batch=4),
    "offload": RunConfig(dp=2, zero=2, offload_optimizer=True, global_batch=8),
    "experts": RunConfig(model="tiny-moe", dp=2, ep=2, global_batch=8),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("hardware", [None, A100_80GB], ids=["memory", "timed"])
def test_a_config_and_its_layout_estimate_the_same(name, hardware):
    config = CONFIGS[name].validate()
    direct = estimate(config, hardware=hardware).to_dict()
    assert direct == estimate(RunLayout.of(config), hardware=hardware).to_dict()
