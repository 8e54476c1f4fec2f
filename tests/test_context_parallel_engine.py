"""Context parallelism in the engine (parallel/context_parallel.py): each rank holds s/cp tokens of every
sample, attention is a ring over the cp group, gradients reduce over dp×cp — and it trains the same model
as one process, with its ring steps, bytes and attention work traced and equal to the formulas.

Tolerance: the data-parallel one (tests/test_data_parallel.py). The ring sums each row's softmax in cp
pieces merged by log-sum-exp, the loss is a mean of cp means and the gradients a sum over dp×cp ranks:
other groupings of the same sums, so only the last bits change — measured ≤ 1e-6 on the loss over 4 steps
for cp 2 and 4, both balances and rotations, beside dp, tp (with sequence parallelism), pp (1F1B and ZB-H1),
ZeRO 1–3 and recomputation.
"""

import os

import pytest

from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, RunConfig
from workbench.predict.formulas.context_parallel import unmasked_pairs_per_rank
from workbench.trace.validate import validate_run

#: the make-test run: the default (head-tail, ring) with checkpoints; the other balance and rotation beside dp
#: (4 ranks: gradients over the dp×cp group) in make test-all — notebook 10 holds cp 2 contiguous with the
#: all-gather, and cp 4, to one process, their recorded pairs, bytes and activations to the formulas in make test
DEFAULT = {"cp": 2, "checkpoint_every": 3}
OTHER = {"cp": 2, "dp": 2, "cp_balance": "none", "cp_rotate": "allgather"}


@pytest.fixture(scope="module")
def single(launched):
    return launched(dp=1)


@pytest.mark.parametrize(
    "config",
    [
        DEFAULT,
        pytest.param(OTHER, marks=pytest.mark.slow),
        pytest.param({"cp": 4}, marks=pytest.mark.slow),
        pytest.param(
            {"cp": 2, "tp": 2, "sequence_parallel": True, "recompute": "selective"},
            marks=pytest.mark.slow,
        ),
        pytest.param({"cp": 2, "dp": 2, "zero": 3}, marks=pytest.mark.slow),
        pytest.param(
            {"cp": 2, "pp": 2, "microbatches": 2, "schedule": "zbh1"}, marks=pytest.mark.slow
        ),
        pytest.param({"cp": 2, "dp": 2, "tp": 2}, marks=pytest.mark.slow),  # 8 ranks
    ],
    ids=[
        "cp2",
        "cp2-dp2-none-allgather",
        "cp4",
        "cp2-tp2-sp-selective",
        "cp2-dp2-zero3",
        "cp2-pp2-zbh1",
        "cp2-dp2-tp2",
    ],
)
def test_context_parallel_trains_the_same_model_as_one_process(launched, single, config):
    run = launched(**config)
    assert_same_training(run, single)
    assert validate_run(run.path) == []
    # every byte on the wire, and every category of memory, as predicted
    for rank in run.summary["ranks"]:
        measured = {
            (op, g, round(b)) for op, d in rank["comm_bytes_per_step"].items() for g, b in d.items()
        }
        predicted = {
            (op, g, round(b))
            for op, d in rank["predicted_comm_bytes_per_step"].items()
            for g, b in d.items()
        }
        assert measured == predicted, (rank["rank"], measured ^ predicted)
        for category, value in rank["predicted_bytes"].items():
            assert rank["peak_bytes"][category] == round(value), (rank["rank"], category)


@pytest.mark.slow  # fp32's bytes are checked in make test (above, and notebook 10)
@pytest.mark.parametrize("rotate", ["ring", "allgather"])
def test_bf16_ring_bytes_equal_the_formula(launched, rotate):
    """K/V travel at the activations' width (2 bytes), dK/dV in fp32 (4): the formula counts both."""
    for rank in launched(cp=2, precision="bf16", cp_rotate=rotate).summary["ranks"]:
        for op in ("send", "recv") if rotate == "ring" else ("all_gather", "reduce_scatter"):
            assert (
                rank["comm_bytes_per_step"][op]["cp"]
                == rank["predicted_comm_bytes_per_step"][op]["cp"]
            ), op


def test_each_layer_rotates_cp_minus_one_blocks_forward_and_cp_backward(launched):
    """Per layer and step: cp − 1 ring steps in forward (each rank computes on its own block, then on
    those arriving), cp − 1 in backward carrying K/V with dK/dV, and one more bringing dK/dV home."""
    run = launched(**DEFAULT)
    ev = run.events
    steps = ev[ev.cat == "cp_ring"]
    layers, n_steps, cp = run.config["model"]["layers"], len(run.metrics), 2
    for rank in (0, 1):
        mine = steps[steps["rank"] == rank]
        assert (mine.phase == "forward").sum() == layers * n_steps * (cp - 1)
        assert (mine.phase == "backward").sum() == layers * n_steps * cp
        assert set(mine.group) == {"cp"} and (mine.bytes > 0).all()


@pytest.mark.parametrize(
    "config", [DEFAULT, pytest.param(OTHER, marks=pytest.mark.slow)], ids=["head-tail", "none"]
)
def test_attention_work_per_rank_is_balanced_by_head_tail_and_skewed_without(launched, config):
    """Each rank's recorded unmasked query-key pairs per layer equal the formula: head-tail gives every
    rank the same; the contiguous split gives the last rank 100 of the 136 pairs (2cp − 1 = 3 times the
    first's as s grows)."""
    seq, balance = RunConfig().model_config.seq_len, config.get("cp_balance", "head-tail")
    counts = {}
    for trace in launched(**config).traces:
        info = trace["workbench"]
        counts.setdefault(info["cp"], set()).update(info["cp_pairs"].values())
    assert all(len(v) == 1 for v in counts.values()), (
        "every layer (and dp replica) does the same work"
    )
    assert [counts[r].pop() for r in range(2)] == unmasked_pairs_per_rank(seq, 2, balance), balance
    assert unmasked_pairs_per_rank(seq, 2, "head-tail") == [68, 68]
    assert unmasked_pairs_per_rank(seq, 2, "none") == [36, 100]


def test_a_cp_run_resumes_bit_identically(launched):
    """fp32 on gloo is deterministic: resumed on cp = 2, the losses equal the uninterrupted run's exactly."""
    full = launched(steps=6, **DEFAULT)
    step3 = os.path.join(full.path, "checkpoints", "step_000003")
    resumed = launched(steps=6, cp=2, resume=step3)
    tail = full.metrics[full.metrics.step >= 3].reset_index(drop=True)
    assert list(resumed.metrics.loss) == list(tail.loss)
    assert list(resumed.metrics.grad_norm) == list(tail.grad_norm)


@pytest.mark.slow  # make test: notebook 08 reshards a checkpoint across layouts (ZeRO-3 → 1 process, tp 2)
def test_a_cp_checkpoint_reshards_to_one_process(launched, single):
    """Context parallelism shards no state, so a cp = 2 checkpoint loads into one process and trains on
    (within the oracle's tolerance: one process sums attention in one piece)."""
    step3 = os.path.join(launched(steps=6, **DEFAULT).path, "checkpoints", "step_000003")
    one = launched(steps=6, dp=1, resume=step3)
    assert list(one.metrics.step) == [3, 4, 5]
    assert_same_training(one, _steps_from(single, 3))


def _steps_from(run, step):
    """A run's metrics from `step` on, as a run-like object for assert_same_training."""

    class Tail:
        metrics = run.metrics[run.metrics.step >= step].reset_index(drop=True)

    return Tail


def test_bad_context_parallel_configs_are_refused_by_name():
    assert RunConfig(cp=2, dp=2).world_size == 4
    RunConfig(cp=2).validate()
    for config, message in (
        ({"cp": 3}, "seq_len=16 must be a multiple of 6"),
        ({"cp_balance": "zigzag"}, "cp_balance='zigzag'"),
        ({"cp_rotate": "alltoall"}, "cp_rotate='alltoall'"),
        ({"cp": 2, "attention": "sdpa"}, "cp=2 with attention='sdpa'"),
        (
            {"cp": 2, "optimizer": "onebit-adam", "steps": 4, "onebit_warmup_steps": 2},
            "with optimizer='onebit-adam'",
        ),
        (
            {"cp": 2, "tp": 4, "sequence_parallel": True, "model": {"seq_len": 20}},
            "each rank's 10 tokens must split",
        ),
    ):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            RunConfig(**config).validate()
