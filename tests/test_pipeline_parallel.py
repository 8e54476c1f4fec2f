"""Pipeline parallelism trains the same model as one process, and its traces show the schedule.

Tolerance as for data parallelism (tests/test_data_parallel.py): the pipeline computes the same sums
per microbatch, and the gradient of the global batch is accumulated over m microbatches (each loss
scaled by 1/m) instead of computed in one pass — a different summation order, so the last bits
differ; measured ≤ 1 ulp of the loss and 2e-7 relative on the gradient norm over 10 steps.
"""

import pytest

from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, ModelConfig, RunConfig
from workbench.analysis.bubble import TERMS
from workbench.trace.validate import validate_run

FOUR_LAYERS = ModelConfig(layers=4)


@pytest.fixture(scope="module")
def single(launched):
    return launched(model=FOUR_LAYERS)


@pytest.mark.parametrize(
    "config",
    [
        # notebook 03 holds GPipe and interleaved (p = 2, m = 4) to one process in make test
        pytest.param({"pp": 2, "schedule": "gpipe", "microbatches": 4}, marks=pytest.mark.slow),
        # notebook 03 holds 1F1B (p = 2, m = 4) to one process in make test
        pytest.param({"pp": 2, "schedule": "1f1b", "microbatches": 4}, marks=pytest.mark.slow),
        pytest.param(
            {"pp": 2, "schedule": "interleaved", "virtual_stages": 2, "microbatches": 4},
            marks=pytest.mark.slow,
        ),
        # notebook 05: pp on 8
        pytest.param({"pp": 4, "schedule": "1f1b", "microbatches": 4}, marks=pytest.mark.slow),
        # notebook 03
        pytest.param(
            {"dp": 2, "pp": 2, "microbatches": 2, "bucket_mb": 0.02}, marks=pytest.mark.slow
        ),
        {"microbatches": 4},
    ],
    ids=["pp2-gpipe", "pp2-1f1b", "pp2-interleaved", "pp4-1f1b", "dp2-pp2", "accumulate-4"],
)
def test_pipeline_matches_single_process(launched, single, config):
    run = launched(model=FOUR_LAYERS, **config)
    assert_same_training(run, single)
    assert validate_run(run.path) == []


@pytest.mark.slow  # notebook 05 holds dp2 × tp2 × pp2 to one process in make test
def test_tensor_and_pipeline_parallel_together(launched, single):
    run = launched(model=FOUR_LAYERS, tp=2, pp=2, microbatches=2, sequence_parallel=True)
    assert_same_training(run, single)


def test_every_action_is_a_span_and_every_send_reaches_its_receive(launched):
    run = launched(model=FOUR_LAYERS, pp=2, schedule="1f1b", microbatches=4)
    ev = run.events
    sched = ev[(ev.lane == "schedule") & (ev.step == 0)]
    import json
    import os

    with open(os.path.join(run.path, "schedule.json")) as f:
        planned = json.load(f)
    for rank in (0, 1):
        executed = list(sched[sched["rank"] == rank].sort_values("start_us")["name"])
        assert executed == planned["program"][rank], "the executor ran the planned program"
        assert [a["label"] for a in planned["actions"][rank]] == [
            x for item in executed for x in item.split(" + ")
        ], "every planned action, in order"
    flows = run.flows[run.flows.cat == "p2p"]
    starts, ends = flows[flows.ph == "s"], flows[flows.ph == "f"]
    joined = starts.merge(ends, on="id", suffixes=("_send", "_recv"))
    assert len(joined) == len(starts) == len(ends) > 0
    assert (joined.rank_send != joined.rank_recv).all()


def test_memory_and_communication_match_the_schedule(launched):
    """GPipe holds m microbatches' activations on every stage, 1F1B at most p − s on stage s: the
    measured peaks equal the schedule walked with each stage's bytes per microbatch."""
    gpipe = launched(model=FOUR_LAYERS, pp=2, schedule="gpipe", microbatches=4)
    one_f_one_b = launched(model=FOUR_LAYERS, pp=2, schedule="1f1b", microbatches=4)
    for run in (gpipe, one_f_one_b):
        for r in run.summary["ranks"]:
            for cat in ("parameter", "gradient", "optimizer_state", "activation"):
                assert r["peak_bytes"][cat] == r["predicted_bytes"][cat], (
                    run.config["schedule"],
                    r["rank"],
                    cat,
                )
            assert r["comm_bytes_per_step"] == r["predicted_comm_bytes_per_step"]
    g0 = gpipe.summary["ranks"][0]["peak_bytes"]["activation"]
    f0 = one_f_one_b.summary["ranks"][0]["peak_bytes"]["activation"]
    assert f0 * 2 == g0, "stage 0 holds 2 (= p) microbatches under 1F1B, 4 (= m) under GPipe"


@pytest.mark.parametrize(
    "config, formula",
    [
        ({"schedule": "1f1b"}, 1 / 5),
        ({"schedule": "gpipe"}, 1 / 5),
        # notebook 03 draws interleaving's measured bubble beside its plan in make test
        pytest.param(
            {"schedule": "interleaved", "virtual_stages": 2}, 1 / 9, marks=pytest.mark.slow
        ),
    ],
    ids=["1f1b", "gpipe", "interleaved"],
)
def test_the_measured_bubble_is_explained_by_the_measured_costs(launched, config, formula):
    """summary.json's split of the bubble sums to the measured bubble, term by term: the formula, what
    the uneven stage costs add, the transfers, each rank's host gaps between actions, its late entry, and
    what is left. `simulated_with_measured_costs` uses compute costs and transfer times only — a model,
    not a replay: on the tiny model it sits well below the measured bubble, since a microbatch's compute
    is as short as the Python around it (the host_gaps term), and above the formula. The unexplained
    rest stays within 25 % of the measured bubble (nine runs here: 2–11 %); a simulator that got the
    schedule wrong, or a term left out, would fall outside it."""
    b = launched(model=FOUR_LAYERS, pp=2, microbatches=4, **config).summary["bubble_fraction"]
    split = b["split"]
    assert b["predicted"] == pytest.approx(formula) and split["formula"] == pytest.approx(formula)
    assert sum(split[t] for t in TERMS) == pytest.approx(split["measured"], abs=1e-12)
    assert b["simulated_with_measured_costs"] > b["predicted"], (
        "this machine's costs are not uniform"
    )
    assert split["host_gaps"] > 0.02, "a tiny model's step is mostly Python between actions"
    assert abs(split["unexplained"]) <= 0.25 * split["measured"], split


@pytest.mark.slow  # notebook 03's bubble against m (small, p = 2) and the --bubble benchmark measure it too
def test_a_compute_bound_pipeline_approaches_the_formula(launched):
    """On `small` (a microbatch's compute ≫ the transfer and Python costs), 1F1B with m = 8 measures close
    to (p − 1)/(m + p − 1) = 1/9. Band: measured − formula in [−0.02, 0.12] — the formula ignores the
    ~1 ms gloo transfer per microbatch boundary on the critical path (benchmarks/pp_vs_torch_pipelining.py
    --bubble measured +0.07) and the stages' uneven costs (the last holds the head and the loss). The
    split explains it: what the measured costs do not account for is under 10 % of the bubble (here:
    about 2 %)."""
    b = launched(model="small", pp=2, microbatches=8, global_batch=32, steps=4).summary[
        "bubble_fraction"
    ]
    assert b["predicted"] == pytest.approx(1 / 9)
    assert -0.02 <= b["measured"] - b["predicted"] <= 0.12, b
    split = b["split"]
    assert sum(split[t] for t in TERMS) == pytest.approx(split["measured"], abs=1e-12)
    assert abs(split["unexplained"]) < 0.10 * split["measured"], split


@pytest.mark.parametrize(
    "change, message",
    [
        ({"pp": 3}, "cannot be split into pp×virtual_stages=3"),
        ({"pp": 2, "microbatches": 3}, "microbatches=3 does not divide"),
        (
            {
                "pp": 4,
                "schedule": "interleaved",
                "virtual_stages": 2,
                "microbatches": 2,
                "model": ModelConfig(layers=8),
            },
            "multiple of pp",
        ),
        ({"pp": 2, "virtual_stages": 2}, "needs schedule='interleaved'"),
        ({"pp": 2, "schedule": "interleaved"}, "needs virtual_stages > 1"),
    ],
)
def test_bad_pipeline_configurations_fail_before_launch(change, message):
    base = {"model": FOUR_LAYERS, **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(**base).validate()


@pytest.mark.parametrize(
    "name, p, m, v",
    [("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2), ("zbh1", 4, 8, 1), ("zbv", 2, 4, 1)],
)
def test_gloos_receives_are_posted_one_batch_early_in_program_order(name, p, m, v):
    """On the CPU the executor posts each batch's receives with the batch before it, the first batch's with
    itself (executor.launch_plan; gloo moves a message only once both ends are posted): every transfer is
    posted once, each send at its own batch, and the receives from each peer rank in program order (gloo
    matches a pair's transfers in the order posted). On CUDA the plan is the program's batches."""
    from workbench.pipeline.executor import launch_plan
    from workbench.schedules.actions import P2PBatch
    from workbench.schedules.build import build_schedule

    s = build_schedule(name, p, m, v)
    for rank in range(p):
        program = s.program(rank)
        batches = [(i, b) for i, b in enumerate(program) if isinstance(b, P2PBatch)]
        assert launch_plan(program, receives_ahead=False) == {i: [b.actions] for i, b in batches}
        plan = launch_plan(program, receives_ahead=True)
        assert sorted(plan) == [i for i, _ in batches]
        posted = [(n, a) for n, (i, _) in enumerate(batches) for group in plan[i] for a in group]
        at = {a: n for n, a in posted}
        assert len(at) == len(posted) == sum(len(b.actions) for _, b in batches), "each once"
        for n, (_, b) in enumerate(batches):
            for a in b.actions:
                assert at[a] == (max(n - 1, 0) if a.is_recv else n), (rank, str(a))
        program_order = [a for _, b in batches for a in b.actions]
        for peer in range(p):
            from_peer = [a for a in program_order if a.is_recv and s.rank_of(a.peer_stage) == peer]
            assert [a for _, a in posted if a in from_peer] == from_peer, (rank, peer)
