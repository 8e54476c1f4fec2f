"""Mixtures of experts (model/moe.py) and expert parallelism (parallel/expert_parallel.py): the routing's
permutation on a fixed case, the aux loss's value under uniform routing, and training equal to one process
for ep = 2 and 4 with E = 4, dropless and with a capacity that drops nothing, beside pp — with the
all-to-alls traced and their bytes, the tokens per expert in metrics.jsonl, a bit-exact resume and a
checkpoint that reshards to one process.

Tolerance: the data-parallel one (tests/test_data_parallel.py): an expert's gradient is summed from the
ranks whose tokens it served by the all-to-all's backward, then over edp, in another order than one
process's — measured ≤ 5e-7 on the loss over 6 steps for every case here. The aux loss is defined per
microbatch (as Megatron's), so the pipelined run is compared without it.
"""

import os

import pytest
import torch

from tests.test_context_parallel_engine import _steps_from
from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, RunConfig
from workbench.config.model_config import PRESETS
from workbench.model.moe import expert_order, switch_aux_loss
from workbench.trace.validate import validate_run

MOE = {"model": "tiny-moe"}
#: the make-test run: dp 2 = ep 2, dropless, with checkpoints for the resume
EP2 = {"model": "tiny-moe", "dp": 2, "ep": 2, "checkpoint_every": 3}
FOUR_LAYERS = {"base": "tiny-moe", "layers": 4}


def test_the_permutation_groups_assignments_by_expert_in_token_order():
    chosen = torch.tensor([[2, 0], [1, 2], [0, 1]])  # three tokens, top-2 of three experts
    order, counts = expert_order(chosen, 3)
    assert counts.tolist() == [2, 2, 2]
    assert (order // 2).tolist() == [0, 2, 1, 2, 0, 1], (
        "expert 0: tokens 0, 2; expert 1: 1, 2; expert 2: 0, 1"
    )
    assert chosen.reshape(-1)[order].tolist() == [0, 0, 1, 1, 2, 2]
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    assert chosen.reshape(-1)[order][inverse].tolist() == chosen.reshape(-1).tolist(), (
        "unpermuting restores"
    )


def test_the_aux_loss_is_its_coefficient_under_uniform_routing_and_more_otherwise():
    e = 4
    uniform = switch_aux_loss(torch.full((e,), 10.0), torch.full((8, e), 1 / e), 0.01)
    assert uniform.item() == pytest.approx(0.01)
    skewed = switch_aux_loss(
        torch.tensor([40.0, 0, 0, 0]), torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 8), 0.01
    )
    assert skewed.item() > 0.02


@pytest.mark.parametrize("router", ["softmax", "sigmoid"])
def test_an_moe_layer_equals_its_definition_token_by_token(router):
    from dataclasses import replace

    from workbench.model.gpt import GPT

    torch.manual_seed(0)
    moe = GPT(replace(PRESETS["tiny-moe"], router=router), seed=0).blocks["0"].mlp
    x = torch.randn(3, 5, 32)
    _, _, gates = moe.route(x.reshape(-1, 32))
    # top-2: renormalised
    torch.testing.assert_close(gates.sum(-1), torch.ones(15), rtol=0, atol=1e-6)
    out = moe(x).reshape(-1, 32)
    _, chosen, gates = moe.route(x.reshape(-1, 32))
    ref = torch.zeros_like(out)
    for t, token in enumerate(x.reshape(-1, 32)):
        for j, e in enumerate(chosen[t].tolist()):
            hidden = torch.nn.functional.gelu(
                token @ moe.experts.fc.weight[e].T + moe.experts.fc.bias[e]
            )
            ref[t] += gates[t, j] * (
                hidden @ moe.experts.proj.weight[e].T + moe.experts.proj.bias[e]
            )
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)


def test_capacity_drops_what_routes_beyond_it_and_the_bias_favours_idle_experts():
    from workbench.model.gpt import GPT, ModelWiring
    from workbench.model.moe import MoEState

    state = MoEState(capacity_factor=0.5, bias_rate=0.1)  # C = ⌈0.5·32·2/4⌉ = 8 of 64 assignments
    moe = GPT(PRESETS["tiny-moe"], seed=0, wiring=ModelWiring(moe=state)).blocks["0"].mlp
    x = torch.randn(2, 16, 32)
    out = moe(x)
    counts = moe.state.counts["blocks.0"]
    assert moe.state.dropped["blocks.0"] == int(sum(max(0, c - 8) for c in counts.tolist())) > 0
    assert torch.isfinite(out).all()
    moe.update_bias()
    busy, idle = counts.argmax(), counts.argmin()
    assert moe.expert_bias[busy] < 0 < moe.expert_bias[idle], (
        "under-loaded experts are raised, busy ones lowered"
    )


@pytest.fixture(scope="module")
def single(launched):
    return launched(**MOE)


@pytest.mark.parametrize(
    "config",
    [
        EP2,
        pytest.param({**MOE, "dp": 4, "ep": 4}, marks=pytest.mark.slow),
        # experts also reduced over edp
        pytest.param({**MOE, "dp": 4, "ep": 2}, marks=pytest.mark.slow),
        pytest.param(
            {**MOE, "dp": 2, "ep": 2, "moe_dispatch": "capacity", "capacity_factor": 4.0},
            marks=pytest.mark.slow,
        ),
        # slices over dp and edp
        pytest.param({**MOE, "dp": 4, "ep": 2, "zero": 1}, marks=pytest.mark.slow),
        pytest.param({**MOE, "dp": 2, "ep": 2, "zero": 2}, marks=pytest.mark.slow),
    ],
    ids=["ep2-dropless", "ep4", "dp4-ep2", "ep2-capacity", "dp4-ep2-zero1", "ep2-zero2"],
)
def test_expert_parallelism_trains_the_same_model_as_one_process(launched, single, config):
    run = launched(**config)
    assert_same_training(run, single)
    assert validate_run(run.path) == []
    ranks = run.summary["ranks"]
    for rank in ranks:  # parameters, gradients and Adam's states: E/ep experts a rank, as predicted
        for category in ("parameter", "gradient", "optimizer_state"):
            assert rank["peak_bytes"][category] == round(rank["predicted_bytes"][category]), (
                category
            )
        if not config.get("zero"):
            predicted = rank["predicted_comm_bytes_per_step"]
            assert rank["comm_bytes_per_step"]["all_reduce"] == pytest.approx(
                predicted["all_reduce"]
            )
    sent = [r["comm_bytes_per_step"]["all_to_all"]["ep"] for r in ranks]
    expected = ranks[0]["predicted_comm_bytes_per_step"]["all_to_all"]["ep"]
    # equal splits: every rank sends E·C rows per all-to-all
    if config.get("moe_dispatch") == "capacity":
        assert sent == [expected] * len(ranks)
    else:  # dropless: what a rank's experts received varies; the group's total is the formula's
        assert sum(sent) == pytest.approx(expected * len(ranks))


def test_each_moe_layer_runs_two_all_to_alls_each_way_and_reports_its_tokens(launched):
    run = launched(**EP2)
    ev = run.events
    a2a = ev[(ev.op == "all_to_all") & (ev["rank"] == 0)]
    layers, steps = PRESETS["tiny-moe"].layers, len(run.metrics)
    for direction in ("forward", "backward"):
        assert a2a.name.str.endswith(direction).sum() == 2 * layers * steps, direction
    assert a2a.name.str.contains("counts").sum() == layers * steps, (
        "dropless: the counts exchanged first"
    )
    # the global batch's assignments
    tokens = 16 * PRESETS["tiny-moe"].seq_len * PRESETS["tiny-moe"].top_k
    for row in run.metrics.itertuples():
        assert {k: sum(v) for k, v in row.tokens_per_expert.items()} == {
            f"blocks.{i}": tokens for i in range(layers)
        }
        assert row.dropped_tokens == 0


@pytest.mark.slow  # 8 ranks
def test_ep_with_dp_and_pp_on_8_ranks_equals_one_process(launched):
    """Without the aux loss: it is defined per microbatch, and with accumulation a data-parallel run's
    microbatch holds other sequences (2 of each rank's) than one process's (8 in a row) — the balance of
    a different set of tokens. With it, dp × ep without accumulation is the whole batch's (above)."""
    model = {"model": FOUR_LAYERS, "microbatches": 2, "aux_loss_coef": 0.0}
    assert_same_training(
        launched(dp=4, ep=2, pp=2, **model), launched(model=FOUR_LAYERS, aux_loss_coef=0.0)
    )


def test_an_ep_run_resumes_bit_identically(launched):
    full = launched(steps=6, **EP2)
    step3 = os.path.join(full.path, "checkpoints", "step_000003")
    resumed = launched(steps=6, model="tiny-moe", dp=2, ep=2, resume=step3)
    tail = full.metrics[full.metrics.step >= 3].reset_index(drop=True)
    assert list(resumed.metrics.loss) == list(tail.loss)
    assert list(resumed.metrics.grad_norm) == list(tail.grad_norm)


@pytest.mark.slow  # make test: notebook 08 reshards a checkpoint across layouts (ZeRO-3 → 1 process, tp 2)
def test_an_ep_checkpoint_reshards_to_one_process(launched, single):
    """Each expert shard is located by index in the whole model's tensor: an ep = 2 checkpoint loads into
    one process holding every expert, and trains on as one process does."""
    step3 = os.path.join(launched(steps=6, **EP2).path, "checkpoints", "step_000003")
    one = launched(steps=6, model="tiny-moe", resume=step3)
    assert_same_training(one, _steps_from(single, 3))


def test_bad_expert_configs_are_refused_by_name():
    RunConfig(model="tiny-moe", dp=2, ep=2).validate()
    for config, message in (
        ({"ep": 2, "dp": 2}, "ep=2 shards experts, and the model has none"),
        ({"model": "tiny-moe", "dp": 2, "ep": 4}, "ep=4 must divide dp=2"),
        (
            {"model": "tiny-moe", "dp": 2, "ep": 2, "moe_dispatch": "greedy"},
            "moe_dispatch='greedy'",
        ),
        ({"model": "tiny-moe", "tp": 2}, "with tp=2"),
        ({"model": "tiny-moe", "dp": 2, "ep": 2, "zero": 3}, "with zero=3"),
        ({"model": {"base": "tiny-moe", "top_k": 5}}, "model.top_k=5"),
    ):
        with pytest.raises(ConfigError, match=message):
            RunConfig(**config).validate()
