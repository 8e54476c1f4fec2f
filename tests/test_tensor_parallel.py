"""Tensor parallelism (and sequence parallelism) trains the same model as one process.

Same tolerance as data parallelism, for the same reason (tests/test_data_parallel.py): the sharded
matmuls add the same products in another grouping (a row-parallel output is t partial sums added by
the all-reduce; the vocabulary-parallel loss sums exponentials per slice), so only the last bits
change — measured: at most 2 ulps of the loss (≈1e-6) and 6e-7 relative on the gradient norm over
10 steps, for tp 2 and 4, with and without sequence parallelism and beside dp.
"""

import pytest

from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, ModelConfig, RunConfig
from workbench.trace.validate import validate_run


@pytest.fixture(scope="module")
def single(launched):
    return launched(dp=1)


@pytest.mark.parametrize(
    "config",
    [
        # notebook 02 holds tp2, dp2×tp2 and tp2 with sequence parallelism to one process in make test
        pytest.param({"tp": 2}, marks=pytest.mark.slow),
        pytest.param({"dp": 2, "tp": 2}, marks=pytest.mark.slow),
        pytest.param({"tp": 2, "sequence_parallel": True}, marks=pytest.mark.slow),
        pytest.param({"tp": 4}, marks=pytest.mark.slow),
        {"dp": 2, "tp": 2, "sequence_parallel": True, "bucket_mb": 0.01},
    ],
    ids=["tp2", "dp2-tp2", "tp2-sp", "tp4", "dp2-tp2-sp"],
)
def test_tensor_parallel_matches_single_process(launched, single, config):
    run = launched(**config)
    assert_same_training(run, single)
    assert validate_run(run.path) == []


def test_every_tp_collective_names_group_layer_and_direction(launched):
    # the oracle test's make-test run
    sp = {
        "dp": 2,
        "tp": 2,
        "sequence_parallel": True,
        "bucket_mb": 0.01,
    }
    ev = launched(**sp).events
    tp_ops = ev[(ev.cat == "collective") & (ev.group == "tp")]
    assert set(tp_ops.op) == {"all_gather", "reduce_scatter", "all_reduce"}
    names = tp_ops["name"]
    assert names.str.contains("forward").any() and names.str.contains("backward").any()
    events = [
        e
        for t in launched(**sp).traces
        for e in t["traceEvents"]
        if e.get("cat") == "collective" and e.get("args", {}).get("group") == "tp"
    ]
    assert all({"layer", "direction", "bytes", "seq"} <= set(e["args"]) for e in events)
    layers = {e["args"]["layer"] for e in events}
    assert {
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
        "blocks.1.mlp.fc",
        "wte",
        "head",
        "loss",
    } <= layers


def test_without_sequence_parallel_a_block_costs_two_all_reduces_each_way(launched):
    run = launched(tp=2)
    ev = run.events
    step0 = ev[(ev.step == 0) & (ev.group == "tp") & (ev["rank"] == 0) & (ev.op == "all_reduce")]
    events = [
        e["args"]
        for e in run.traces[0]["traceEvents"]
        if e.get("ph") == "X"
        and e.get("args", {}).get("group") == "tp"
        and e["args"].get("step") == 0
    ]
    block0 = [a for a in events if str(a.get("layer", "")).startswith("blocks.0.")]
    assert sorted((a["layer"].split(".", 2)[2], a["direction"]) for a in block0) == [
        ("attn.proj", "forward"),
        ("attn.qkv", "backward"),
        ("mlp.fc", "backward"),
        ("mlp.proj", "forward"),
    ]
    assert len(step0) > 0


@pytest.mark.slow  # notebook 02 checks activations measured = predicted for the same t in make test
def test_memory_per_rank_matches_the_formulas_for_this_t(launched):
    for config in ({"tp": 2}, {"tp": 2, "sequence_parallel": True}, {"tp": 4}):
        run = launched(**config)
        for r in run.summary["ranks"]:
            for cat in ("parameter", "gradient", "optimizer_state", "activation"):
                assert r["peak_bytes"][cat] == r["predicted_bytes"][cat], (config, cat)
    t1 = launched(dp=1).summary["ranks"][0]["peak_bytes"]["activation"]
    t2 = launched(tp=2).summary["ranks"][0]["peak_bytes"]["activation"]
    sp = launched(tp=2, sequence_parallel=True).summary["ranks"][0]["peak_bytes"]["activation"]
    assert sp < t2 < t1


@pytest.mark.parametrize(
    "model, tp, what",
    [
        (ModelConfig(heads=4, hidden=32, vocab_size=64), 3, "heads"),
        (ModelConfig(heads=6, hidden=48, vocab_size=64), 4, "heads"),
        (ModelConfig(heads=4, hidden=32, vocab_size=66), 4, "vocab_size"),
    ],
)
def test_indivisible_tp_is_rejected_before_launch(model, tp, what):
    with pytest.raises(ConfigError, match=f"tp={tp} does not divide model.{what}"):
        RunConfig(model=model, tp=tp).validate()


def test_sequence_parallel_needs_tp():
    with pytest.raises(ConfigError, match="needs tp > 1"):
        RunConfig(sequence_parallel=True).validate()
    with pytest.raises(ConfigError, match="seq_len"):
        RunConfig(model=ModelConfig(seq_len=10), tp=4, sequence_parallel=True).validate()


@pytest.mark.slow  # notebook 02 checks the tp bytes measured = predicted for the same layouts in make test
def test_communication_per_step_matches_the_formula(launched):
    # the oracle test's runs; dp × tp with small buckets is {"dp": 2, "tp": 2, "sequence_parallel": True, …}
    for config in (
        {"tp": 2},
        {"tp": 4, "sequence_parallel": True},
        {"dp": 2, "tp": 2},
        {"dp": 2, "tp": 2, "sequence_parallel": True, "bucket_mb": 0.01},
    ):
        for r in launched(**config).summary["ranks"]:
            assert r["comm_bytes_per_step"] == r["predicted_comm_bytes_per_step"], config


def test_shards_chart_uses_the_recorded_shapes(launched):
    from workbench import viz

    run = launched(tp=2)
    table = viz.shard_table(run)
    qkv = table[(table.parameter == "blocks.0.attn.qkv.weight")]
    assert set(qkv["shape"]) == {(48, 32)}  # 3·h/t rows of the (3h × h) matrix
    assert len(viz.tp_shards(run).layout.shapes) > 0
