"""DualPipe and DualPipeV (DeepSeek-V3, 2024; deepseek-ai/DualPipe): runs held to one process and to their
predictions, DeepSeek's table beside our schedules, and the estimator, planner and what-if that take them.

Tolerance for the losses: 1e-5 (the issue's), as ZB-H1's and ZBV's (tests/test_zero_bubble.py): an F&B pair
runs its F then its B, the split tail defers each weight gradient to its W, so only the order in which a
weight gradient's terms are summed changes; DualPipe's twin copies add each other's gradients (a + b = b + a,
exactly), so both copies take the same update. Measured here: the losses of 6 steps equal one process's to
within 1 ulp of the loss.

Memory: every category a rank's counters measured (parameters, gradients, optimizer states, activations,
the W stash, the loss's bytes) equals the formula exactly — the formula walks the rank's generated schedule,
each stage counted as the part of the model it holds (formulas/run.py) — and the bytes each rank sent equal
the prediction, DualPipe's twin-gradient exchange included.
"""

from __future__ import annotations

import pytest

import workbench as wb
from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, ModelConfig
from workbench.cli import main as cli
from workbench.predict import formulas
from workbench.predict.estimator import H100_80GB, RunLayout, estimate
from workbench.predict.planner import Cluster, plan
from workbench.schedules.build import build_schedule, simulate
from workbench.trace.validate import validate_run

FOUR, EIGHT = ModelConfig(layers=4), ModelConfig(layers=8)


# ---- runs and predictions ------------------------------------------------------------------------
def pp_stages(schedule: str, p: int) -> int:
    """DeepSeek's PP: DualPipe's stages per copy (p), DualPipeV's V (2p)."""
    return formulas.deepseek_memory(schedule, p).stages


@pytest.mark.parametrize(
    "schedule, p",
    # DualPipe folds its row of ranks in two: pp even (config/pipeline_rules.py refuses an odd one)
    [("dualpipe", p) for p in (2, 4, 6, 8)] + [("dualpipev", p) for p in (2, 3, 4, 6, 8)],
)
def test_our_schedules_hold_deepseeks_pp_plus_one_microbatches(schedule, p):
    """DeepSeek's table: PP + 1 stage-microbatches of activations per rank, parameters 2× a PP-stage
    device's. Our generated schedules hold exactly PP + 1 on every rank, for every m tried (1F1B and ZB-H1:
    PP on their first rank); in our units the parameters are 2× a p-rank 1F1B rank's for DualPipe (two
    parts of 1/p) and 1× for DualPipeV (two of 1/2p)."""
    PP = pp_stages(schedule, p)
    for m in (2 * p, 2 * p + 2, 4 * p, 10 * p):
        held = formulas.deepseek_memory(schedule, p, m)
        assert held.activations == PP + 1
        assert held.in_flight == [PP + 1] * p, (m, held.in_flight)
    assert held.parameters == (2.0 if schedule == "dualpipe" else 1.0)
    for baseline in ("1f1b", "zbh1"):
        assert formulas.deepseek_memory(baseline, p, 2 * p).in_flight[0] == p


def test_dualpipes_parameters_are_two_parts_of_a_p_part_model():
    """Rank r of DualPipe holds part r of one copy and part p − 1 − r of the other: what 1F1B's ranks r and
    p − 1 − r hold together, 2× a 1F1B rank's where the parts are alike."""
    model, p = ModelConfig(layers=8, vocab_size=512), 4
    loop = [formulas.params_per_rank(model, pp=p, pp_rank=r) for r in range(p)]
    for r in range(p):
        dual = formulas.params_per_rank(model, pp=p, virtual_stages=2, pp_rank=r, placement="dual")
        assert dual == loop[r] + loop[p - 1 - r]
    middle = formulas.params_per_rank(model, pp=p, virtual_stages=2, pp_rank=1, placement="dual")
    assert middle == 2 * loop[1]


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_the_formula_rate_is_deepseeks_bubble_and_our_simulation(schedule, p):
    """The summary's `formula_rate`: DeepSeek's (PP/2 − 1)(F&B + B − 3W) over a rank's work at T_F = T_I =
    T_W, F&B = F + B — (p − 2)/3m for DualPipe, (p − 1)/3m for DualPipeV — equals the rate our schedule
    simulates with sends that never wait (the formula's world)."""
    for m in (2 * p, 2 * p + 2, 5 * p + p % 2):
        s = build_schedule(schedule, p, m)
        simulated = simulate(s, t_f=1.0, t_b=2.0, t_w=1.0, rule="gloo").bubble_rate()
        assert formulas.bubble_rate(schedule, p, m) == pytest.approx(simulated, abs=1e-12), m
        assert formulas.schedule_bubble_fraction(s) == pytest.approx(
            simulate(s, t_f=1.0, t_b=2.0, t_w=1.0, rule="gloo").bubble_fraction(), abs=1e-12
        )
    expected = (p - 2) / (3 * m) if schedule == "dualpipe" else (p - 1) / (3 * m)
    assert formulas.bubble_rate(schedule, p, m) == pytest.approx(expected)


@pytest.mark.parametrize(
    "model, config",
    [
        (FOUR, {"pp": 2, "schedule": "dualpipev", "microbatches": 4}),
        (FOUR, {"pp": 2, "schedule": "dualpipe", "microbatches": 4}),
        # four ranks on two cores: make test holds both at pp 2
        pytest.param(
            EIGHT, {"pp": 4, "schedule": "dualpipev", "microbatches": 8}, marks=pytest.mark.slow
        ),
        pytest.param(
            EIGHT, {"pp": 4, "schedule": "dualpipe", "microbatches": 8}, marks=pytest.mark.slow
        ),
    ],
    ids=["dualpipev-pp2", "dualpipe-pp2", "dualpipev-pp4", "dualpipe-pp4"],
)
def test_dualpipe_trains_one_processs_model_and_measures_what_it_predicts(launched, model, config):
    single = launched(model=model)
    run = launched(model=model, **config)
    assert_same_training(run, single)
    assert (run.metrics.loss - single.metrics.loss).abs().max() < 1e-5
    assert validate_run(run.path) == []
    ranks = run.summary["ranks"]
    for r in ranks:
        for category, predicted in r["predicted_bytes"].items():
            assert r["peak_bytes"][category] == predicted, (r["rank"], category)
        # the activations and gradients between stages; DualPipe's twin gradients; a V's turn: none
        assert r["comm_bytes_per_step"] == r["predicted_comm_bytes_per_step"], r["rank"]
    name, p, m = config["schedule"], config["pp"], config["microbatches"]
    # measured parameters: DualPipe's ranks hold two copies' parts (each part twice over the row),
    # DualPipeV's the model once — the allocator's bytes beside one process's
    whole = single.summary["ranks"][0]["peak_bytes"]["parameter"]
    held = [r["peak_bytes"]["parameter"] for r in ranks]
    assert sum(held) == (2 if name == "dualpipe" else 1) * whole
    if name == "dualpipe":
        assert all(held[r] == held[p - 1 - r] for r in range(p)), "twins hold the same parts"
    # measured activations: a rank holding no embedding and no head holds PP + 1 stage-microbatches
    sched = build_schedule(name, p, m)
    part, parts = sched.model_part(1)
    one = formulas.stage_activation_bytes(
        formulas.run_model(run.config),
        run.config["global_batch"] // m,
        stage=part,
        stages=parts,
    )
    inner = [
        r
        for r in range(p)
        if all(
            0 < sched.model_part(k)[0] < parts - 1
            for k in range(sched.stages)
            if sched.rank_of(k) == r
        )
    ]
    # DualPipe at pp 2: both ranks hold an embedding and a head (parts 0 and 1 of 2)
    assert bool(inner) == (not (name == "dualpipe" and p == 2))
    for r in inner:
        assert ranks[r]["peak_bytes"]["activation"] == (pp_stages(name, p) + 1) * one, r
    # the bubble's formula rate is DeepSeek's, our schedule's at free transfers
    assert run.summary["bubble_fraction"]["formula_rate"] == pytest.approx(
        simulate(sched, t_f=1.0, t_b=2.0, t_w=1.0, rule="gloo").bubble_rate(), abs=1e-12
    )
    # the estimator's memory is the run's own prediction, and that the simultaneous peak measured (0.1 %)
    settings = {"model": model, **config, "steps": 6, "timeout_s": 30.0, "backend": "gloo"}
    est = estimate(wb.RunConfig(**settings), backend_copies=True)
    _, total, _ = formulas.predicted_memory(run.config)
    assert est.memory_bytes_per_rank == pytest.approx(total)
    assert total == pytest.approx(max(r["peak_total_bytes"] for r in ranks), rel=1e-3)


def test_the_estimate_prices_dualpipes_copies_and_the_planner_lists_valid_schedules():
    """DualPipe's rank 0 holds the model states of 1F1B's ranks 0 and p − 1 (parts 0 and p − 1), and sends
    its whole gradient to its twin; the planner tries each schedule only where it is valid."""
    model = ModelConfig(vocab_size=512, seq_len=128, hidden=256, heads=4, layers=8)
    base = {"model": model, "pp": 4, "microbatches": 8, "global_batch": 16, "precision": "bf16"}
    dual = estimate(RunLayout(**base, schedule="dualpipe", virtual_stages=2), hardware=H100_80GB)
    one = RunLayout(**base).run_dict(backend_copies=False, device="cuda")
    states = ("parameter", "gradient", "optimizer_state")
    ends = sum(formulas.predicted_bytes(one, r)[k] for r in (0, 3) for k in states)
    assert dual.model_state_bytes_per_rank == pytest.approx(ends)
    assert dual.step_terms["pipeline"] > 0 and dual.bubble_fraction == pytest.approx(
        formulas.schedule_bubble_fraction(build_schedule("dualpipe", 4, 8))
    )
    names = ("1f1b", "zbv", "dualpipev", "dualpipe")
    table = plan(
        model, Cluster(nodes=1, hardware=H100_80GB), global_batch=32, schedules=names
    ).candidates
    piped = table[table.pp > 1]
    assert set(piped.schedule) == set(names)
    dp = piped[piped.schedule == "dualpipe"]
    assert (dp.pp % 2 == 0).all() and (dp.microbatches >= 2 * dp.pp).all() and (dp.zero == 0).all()
    dv = piped[piped.schedule == "dualpipev"]
    assert (dv.microbatches >= 2 * dv.pp).all() and (model.layers % (2 * dv.pp) == 0).all()
    with pytest.raises(ConfigError, match="valid: gpipe, 1f1b"):
        plan(model, Cluster(nodes=1, hardware=H100_80GB), global_batch=32, schedules=("dualpipx",))


def test_a_1f1b_trace_re_laid_as_dualpipev_is_its_simulation(launched, capsys):
    """The what-if on a recorded 1F1B run (pp 2, m 4): the step replayed, its pipeline span swapped for
    DualPipeV's simulated from the run's own costs — each half-stage half the 1F1B stage holding its layers,
    I and W half of B, each rank's host time per send kept — at the run's measured transfer time."""
    from workbench.analysis import bubble
    from workbench.trace.merge import load_traces

    run = launched(model={"base": "tiny", "layers": 4}, global_batch=16, pp=2, microbatches=4)
    answer = wb.what_if(run.path, schedule="dualpipev")
    old, new = build_schedule("1f1b", 2, 4), build_schedule("dualpipev", 2, 4)

    def sends_per_action(s, r):
        acts = s.actions[r]
        return sum(a.is_send for a in acts) / sum(a.kind in ("F", "B", "I", "W") for a in acts)

    deltas = []
    for replica in bubble.pipelines(load_traces(run.path), 2):
        transfer = bubble.transfer_time(list(replica.values()))
        steps = sorted(bubble.step_inputs(old, replica).items())[1:]
        for step, inputs in steps:
            cost = {}
            for s in range(4):  # V stages 0, 1: halves of 1F1B's stage 0; 2, 3 of its stage 1
                f, b = inputs["cost"][(s // 2, "F")] / 2, inputs["cost"][(s // 2, "B")] / 2
                cost.update({(s, "F"): f, (s, "B"): b, (s, "I"): b / 2, (s, "W"): b / 2})
            gap = {
                r: g * sends_per_action(new, r) / sends_per_action(old, r)
                for r, g in inputs["gap"].items()
            }
            t = transfer.get(step, 0.0)
            new_span = simulate(new, cost=bubble.action_costs(cost, gap), t_comm=t, rule="gloo")
            old_span = simulate(
                old, cost=bubble.action_costs(inputs["cost"], inputs["gap"]), t_comm=t, rule="gloo"
            )
            deltas.append(new_span.makespan - old_span.makespan)
    assert deltas
    expected = answer.source_replayed_s + sum(deltas) / len(deltas) / 1e6
    assert answer.predicted_s == pytest.approx(expected, rel=1e-9)
    assert "→ dualpipev m=4 v=2" in answer.notes[0]
    assert cli(["what-if", run.path, "--schedule", "dualpipev", "--no-calibrate"]) == 0
    assert "what if schedule=dualpipev" in capsys.readouterr().out
    # DualPipe needs an even number of microbatches ≥ 2·pp: said before anything is simulated
    with pytest.raises(ConfigError, match="even number of microbatches"):
        wb.what_if(run.path, schedule="dualpipe", microbatches=2)
