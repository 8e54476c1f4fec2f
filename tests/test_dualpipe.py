"""DualPipe and DualPipeV (DeepSeek-V3, 2024; workbench/schedules/dualpipe.py): bidirectional pipelines as
data — validated for every pp and microbatches they accept and refused elsewhere, their F&B pairs issued
as one step, their idle time DeepSeek's formula —, held to torch's `ScheduleDualPipeV`, to torch's runtime,
and to one process and to their predictions, DeepSeek's table beside our schedules, and the estimator,
planner and what-if that take them.

Tolerance for the losses: 1e-5 (the issue's), as ZB-H1's and ZBV's (tests/test_zero_bubble.py): an F&B pair
runs its F then its B, the split tail defers each weight gradient to its W, so only the order in which a
weight gradient's terms are summed changes; DualPipe's twin copies add each other's gradients (a + b = b + a,
exactly), so both copies take the same update. Measured here: the losses of 6 steps equal one process's to
within 1 ulp of the loss.

Memory: every category a rank's counters measured (parameters, gradients, optimizer states, activations,
the W stash, the loss's bytes) equals the formula exactly — the formula walks the rank's generated schedule,
each stage counted as the part of the model it holds (formulas/run.py) — and the bytes each rank sent equal
the prediction, DualPipe's twin-gradient exchange included.

Our DualPipeV CSV training in torch's `_PipelineScheduleRuntime` (CPU, gloo) as one process trains
is tests/test_zero_bubble.py's `test_torchs_runtime_runs_our_zbh1_and_dualpipev_and_we_run_torchs_...`:
one torchrun launch runs both CSVs against one single-process reference, so the case costs seconds.
"""

import dataclasses
import os
import types

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _PipelineScheduleRuntime

import workbench as wb
from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, ModelConfig, RunConfig
from workbench.cli import main as cli
from workbench.predict import formulas
from workbench.predict.estimator import H100_80GB, RunLayout, estimate
from workbench.predict.formulas.zero_bubble import dualpipe_bubble
from workbench.predict.planner import Cluster, plan
from workbench.schedules.actions import P2PBatch, compute_cells, flatten
from workbench.schedules.build import build_schedule, simulate, validate
from workbench.schedules.dualpipe import dualpipe_orders, dualpipev_orders
from workbench.schedules.torch_csv import read_csv, write_csv
from workbench.trace.validate import validate_run


# ---- schedules as data ---------------------------------------------------------------------------
def accepted(name: str, p: int) -> list[int]:
    """Microbatch counts each schedule accepts at pp = p (a sample: 2p and the next few)."""
    step = 2 if name == "dualpipe" else 1
    return list(range(2 * p, 2 * p + 6 * step + 1, step)) + [8 * p]


@pytest.mark.parametrize(
    "name, p",
    [("dualpipev", p) for p in (2, 3, 4, 5, 6, 8)] + [("dualpipe", p) for p in (2, 4, 6, 8)],
)
def test_every_accepted_pp_and_microbatches_validates_under_nccls_rule(name, p):
    """Coverage, the hand-overs, every transfer matched and in the same order on both ranks, and no
    deadlock when a send waits for its receive (NCCL's rule, which implies gloo's)."""
    for m in accepted(name, p):
        s = build_schedule(name, p, m)
        assert validate(s) == [], (name, p, m)
        assert s.v == 2 and s.placement == ("dual" if name == "dualpipe" else "v")


@pytest.mark.parametrize(
    "name, p, m, v",
    [(n, p, 2 * p, 1) for n in ("gpipe", "1f1b", "zbh1") for p in (2, 4)]
    + [("interleaved", p, 2 * p, 2) for p in (2, 4)]
    + [(n, p, m, 2) for n in ("zbv", "dualpipev") for p in (2, 3, 4, 8) for m in (2 * p, 3 * p + 1)]
    + [("dualpipe", p, m, 2) for p in (2, 4, 8) for m in (2 * p, 4 * p + 2)],
)
def test_the_validation_losss_forward_only_program_is_safe(name, p, m, v):
    """The validation loss runs each schedule's forwards alone (`Schedule.forward_only`): no F&B pair left,
    the transfers between two ranks in the same order on both sides, and no deadlock under NCCL's rule —
    checked, not inherited: in a V and in DualPipe activations cross a pair of ranks both ways."""
    from workbench.schedules.validation import pair_order

    fwd = build_schedule(name, p, m, v).forward_only()
    assert all(
        a.pair is None and a.kind in ("F", "SEND_F", "RECV_F") for acts in fwd.actions for a in acts
    )
    assert pair_order(fwd) == []
    simulate(fwd, 1.0, 2.0)  # raises ScheduleError on a deadlock


@pytest.mark.parametrize(
    "name, p, m, says",
    [
        ("dualpipev", 1, 4, "pp ≥ 2"),
        ("dualpipev", 4, 7, "microbatches ≥ 2·pp"),
        ("dualpipe", 3, 8, "even pp"),
        ("dualpipe", 4, 9, "even number of microbatches"),
        ("dualpipe", 4, 6, "≥ 2·pp"),
    ],
)
def test_other_sizes_are_refused_naming_what_is_valid(name, p, m, says):
    with pytest.raises(ValueError, match=says) as e:
        build_schedule(name, p, m)
    assert f"pp={p}" in str(e.value) and f"microbatches={m}" in str(e.value)


@pytest.mark.parametrize(
    "config, says",
    [
        ({"schedule": "dualpipe", "pp": 3, "microbatches": 6}, "pp must be even, got pp=3"),
        ({"schedule": "dualpipe", "pp": 2, "microbatches": 5}, "microbatches must be even"),
        ({"schedule": "dualpipev", "pp": 2, "microbatches": 2}, "valid: 4, 5, 6"),
        ({"schedule": "dualpipe", "pp": 2, "microbatches": 2}, "valid: 4, 6, 8"),
        (
            {"schedule": "dualpipe", "pp": 2, "microbatches": 4, "model": {"base": "tiny-moe"}},
            "use schedule='dualpipev' with experts",
        ),
        ({"schedule": "dualpipe", "pp": 2, "microbatches": 4, "zero": 1}, "use zero=0"),
        ({"schedule": "dualpipev", "pp": 2, "microbatches": 4, "zero": 3}, "zero ≤ 2"),
        ({"schedule": "dualpipev", "pp": 2, "virtual_stages": 3}, "virtual_stages must be 2"),
        # DualPipe cuts each copy in pp parts, DualPipeV the model in 2·pp
        ({"schedule": "dualpipev", "pp": 2, "microbatches": 4, "model": {"layers": 6}}, "valid"),
    ],
)
def test_bad_configurations_fail_before_anything_starts(config, says):
    config = {"global_batch": 8, **config}
    with pytest.raises(ConfigError, match=says):
        RunConfig(**config).validate()


def test_a_csv_that_reads_as_dualpipe_meets_dualpipes_rules(tmp_path):
    """The rules follow a CSV's own actions: a file whose stages are DualPipe's two pipelines builds two
    copies with twin gradients, so ZeRO is refused as with schedule='dualpipe' (it trained 7.7e-3 off one
    process before); a file with I actions splits backward, so compile and ZeRO-3 are refused."""
    path = str(tmp_path / "dual.csv")
    write_csv(build_schedule("dualpipe", 2, 4), path)
    base = {"schedule": f"csv:{path}", "pp": 2, "virtual_stages": 2, "microbatches": 4}
    with pytest.raises(ConfigError, match="use zero=0"):
        RunConfig(dp=2, zero=1, global_batch=8, **base).validate()
    RunConfig(dp=2, global_batch=8, **base).validate()
    with pytest.raises(ConfigError, match="compile=True"):
        RunConfig(compile=True, global_batch=8, **base).validate()


def test_dualpipe_cuts_each_copy_in_pp_parts():
    """Six layers on pp 2: DualPipe's two copies take 3 layers a stage; DualPipeV's V needs 4 stages."""
    RunConfig(
        schedule="dualpipe", pp=2, microbatches=4, global_batch=8, model=ModelConfig(layers=6)
    ).validate()


@pytest.mark.parametrize("name, p", [("dualpipev", 2), ("dualpipev", 4), ("dualpipe", 4)])
def test_an_fb_pair_is_one_step_its_transfers_before_and_after_it(name, p):
    """No batch of transfers between a pair's F and its B: what both need was received before, what both
    made is sent after (DeepSeek's `_forward_backward_chunk`). Every rank runs pairs in the steady state."""
    s = build_schedule(name, p, 4 * p)
    for rank in range(p):
        program = s.program(rank)
        pairs = [i for i, item in enumerate(program) if getattr(item, "pair", None) is not None]
        assert pairs, rank
        for i in pairs[::2]:
            f, b = program[i], program[i + 1]
            assert not isinstance(b, P2PBatch) and (f.kind, b.kind) == ("F", "B"), (rank, i)
            assert f.pair == b.pair and (f.stage, f.microbatch) != (b.stage, b.microbatch)


@pytest.mark.parametrize(
    "kind, says",
    [
        ("a pair of two forwards", "want an F followed at once by a B"),
        ("a pair numbered once", "want an F followed at once by a B"),
        ("a microbatch on the other pipeline", "takes DualPipe's other pipeline"),
    ],
)
def test_each_rule_catches_its_malformed_pair(kind, says):
    s = build_schedule("dualpipe", 2, 4)
    acts = s.actions[0]
    i = next(k for k, a in enumerate(acts) if a.pair is not None)
    if kind == "a pair of two forwards":
        j = max(k for k, a in enumerate(acts) if k < i and a.kind == "F" and a.pair is None)
        acts[j] = dataclasses.replace(acts[j], pair=acts[i].pair)
        acts[i + 1] = dataclasses.replace(acts[i + 1], pair=None)
    elif kind == "a pair numbered once":
        acts[i + 1] = dataclasses.replace(acts[i + 1], pair=None)
    else:
        f0 = next(k for k, a in enumerate(acts) if a.kind == "F" and a.stage == 0)
        acts[f0] = dataclasses.replace(
            acts[f0], microbatch=s.m - 1
        )  # stage 0 carries the first half
    assert any(says in e for e in validate(s)), validate(s)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("fb", [None, 2.0, 2.5])
def test_the_idle_per_rank_is_deepseeks_formula(p, fb):
    """(PP/2 − 1)(F&B + B − 3W), DeepSeek's bubble, is our simulated idle per rank over the step — with
    free transfers (rule="gloo": a send never waits, as the formula assumes) — for DualPipe (PP = p, each
    stage 1/p of a copy) and DualPipeV (PP = 2p, each stage half a rank's share), at T_F = T_I = T_W and
    any pair cost from B (a GPU hiding one half) to F + B (one thread, nothing overlaps): the regime the
    schedule is planned for (the next test shows the formula leave it)."""
    for name, m in (
        ("dualpipe", 2 * p),
        ("dualpipe", 4 * p),
        ("dualpipev", 2 * p),
        ("dualpipev", 3 * p),
    ):
        s = build_schedule(name, p, m)
        t = simulate(s, 1.0, 2.0, t_w=1.0, t_fb=fb, rule="gloo")
        idle = max(t.makespan - sum(e - b for _, b, e in spans) for spans in t.spans)
        stages, k = (p, 1.0) if name == "dualpipe" else (2 * p, 0.5)
        formula = dualpipe_bubble(stages, f=k, b=2 * k, w=k, fb=None if fb is None else fb * k)
        assert idle == pytest.approx(formula, abs=1e-9), (name, p, m)


def test_away_from_its_regime_the_formula_departs_from_the_simulation_both_ways():
    """DualPipe, p = 4, m = 16, F = 1 (a rank's share): a pair cheaper than B idles more than the formula
    says (the warm-up and the tail do not shrink with it), a W longer than I too (the deferred W no
    longer fits the bubbles), a W shorter than I less. The simulation is the prediction there."""

    def both(t_w: float, fb: float) -> tuple[float, float]:
        t = simulate(build_schedule("dualpipe", 4, 16), 1.0, 2.0, t_w=t_w, t_fb=fb, rule="gloo")
        idle = max(t.makespan - sum(e - b for _, b, e in spans) for spans in t.spans)
        return idle, dualpipe_bubble(4, f=1.0, b=2.0, w=t_w, fb=fb)

    assert both(1.0, 1.5) == (1.5, 0.5)
    assert both(1.5, 3.0) == (2.0, 0.5)
    assert both(0.5, 3.0) == (3.0, 3.5)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_dualpipe_folded_at_its_middle_is_dualpipev(p):
    """The cut-in-half: rank r of DualPipe runs what rank min(r, p − 1 − r) of DualPipeV over p/2 ranks runs
    with m/2 microbatches — the same kinds in the same order — the phase that enters at its end first."""
    m = 4 * p
    dual, v = dualpipe_orders(p, m), dualpipev_orders(p // 2, m // 2) if p > 2 else None
    for r in range(p):
        kinds = [k for k, _, _ in flatten(dual[r])]
        if v is not None:
            assert kinds == [k for k, _, _ in flatten(v[min(r, p - 1 - r)])], r
        stages = {st for _, st, _ in flatten(dual[r])}
        assert stages == {r, 2 * p - 1 - r}, (
            "a rank holds its part of one copy and p − 1 − r of the other"
        )
    s = build_schedule("dualpipe", p, m)
    for st in range(2 * p):  # each microbatch through the p stages of its own pipeline only
        assert {
            a.microbatch for acts in s.actions for a in acts if a.kind == "F" and a.stage == st
        } == (set(range(m // 2)) if st < p else set(range(m // 2, m)))
    assert s.model_part(p + 1) == (1, p) and s.twin(1) == p + 1 and s.next_stage(p - 1) is None


def test_dualpipe_round_trips_through_torch_csv_as_two_pipelines(tmp_path):
    """Torch's CSV has no word for DualPipe's two pipelines: a file whose stages sit in a V but whose
    microbatches each pass one half is read back as DualPipe, pairs and all."""
    for name in ("dualpipe", "dualpipev"):
        s = build_schedule(name, 4, 8)
        path = str(tmp_path / f"{name}.csv")
        write_csv(s, path)
        back = read_csv(path, 8)
        assert back.actions == s.actions and back.placement == s.placement, name


def test_schedule_show_prints_deepseeks_bubble_beside_the_simulation(capsys):
    assert (
        cli(["schedule", "show", "--schedule", "dualpipev", "--pp", "4", "--microbatches", "8"])
        == 0
    )
    out = capsys.readouterr().out
    assert "(0F7;7B3)" in out and "simulated 3, DeepSeek's" in out and "PP = 8: 3" in out
    assert (
        cli(["schedule", "export", "--schedule", "dualpipe", "--pp", "2", "--microbatches", "4"])
        == 0
    )
    assert "OVERLAP_F_B" in capsys.readouterr().out


# ---- runs: DualPipe's two copies, data parallelism ----------------------------------------------
def test_a_stage_that_runs_b_then_i_and_w_syncs_its_gradients_after_the_last_i_and_w():
    """DualPipe's tail turns a stage's backwards from B to I/W: the gradient sync must launch after the
    stage's last I (the layer norms' last gradient) and its last W (the Linears'), not at its last B —
    launched there, data parallelism all-reduced half-made gradients (found at dp 2: loss off by 2e-3)."""
    from workbench.pipeline.executor import last_contributions
    from workbench.schedules.actions import Action

    def a(kind, stage, mb):
        return Action(kind=kind, stage=stage, microbatch=mb)

    program = [a("F", 0, 0), a("F", 0, 1), a("B", 0, 0), a("F", 1, 0), a("I", 0, 1), a("B", 1, 0)]
    program += [a("W", 0, 1)]
    assert last_contributions(program) == {4, 5, 6}  # stage 0's last I and W, stage 1's only B


@pytest.mark.parametrize(
    "config",
    [
        {"dp": 2, "schedule": "dualpipev", "bucket_mb": 0.02},
        {"dp": 2, "schedule": "dualpipe", "bucket_mb": 0.02},
        {"tp": 2, "sequence_parallel": True, "schedule": "dualpipe"},
    ],
    ids=["dp2-dualpipev", "dp2-dualpipe", "tp2sp-dualpipe"],
)
def test_composed_with_dp_and_tp_it_trains_the_same_model_as_one_process(launched, config):
    """Four ranks: the data-parallel buckets launch once per chunk after its last gradient (above; both
    schedules trained off one process at dp 2 before); DualPipe's twin sum runs after the data-parallel
    all-reduce and the sequence-parallel partial sums, with which it commutes."""
    model = ModelConfig(layers=4)
    run = launched(model=model, pp=2, microbatches=4, **config)
    assert_same_training(run, launched(model=model))


def test_dualpipe_resumes_bit_identically_from_the_first_copys_checkpoint(launched):
    """The checkpoint holds each part once (the second copy, `pipeline_copy`, is not written) and loading
    fills both copies: the resumed run continues exactly (tolerance 0), its gradient norm too (the second
    copy is not counted twice)."""
    config = {
        "model": ModelConfig(layers=4),
        "pp": 2,
        "schedule": "dualpipe",
        "microbatches": 4,
        "steps": 4,
        "checkpoint_every": 2,
    }
    run = launched(**config)
    resumed = launched(resume=os.path.join(run.path, "checkpoints", "step_000002"), **config)
    tail = run.metrics[run.metrics.step >= 2].reset_index(drop=True)
    assert list(resumed.metrics.loss) == list(tail.loss)
    assert list(resumed.metrics.grad_norm) == list(tail.grad_norm)


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
        # the summary's `predicted` fraction: DeepSeek's idle over a step of 3m work units plus that idle
        # (every rank idles the same at equal costs)
        k = 1.0 if schedule == "dualpipe" else 0.5  # a stage's share of a rank's
        idle = formulas.dualpipe_bubble(pp_stages(schedule, p), f=k, b=2 * k, w=k)
        assert formulas.schedule_bubble_fraction(s) == pytest.approx(
            idle / (3 * m + idle), abs=1e-12
        )
    expected = (p - 2) / (3 * m) if schedule == "dualpipe" else (p - 1) / (3 * m)
    assert formulas.bubble_rate(schedule, p, m) == pytest.approx(expected)


@pytest.mark.parametrize(
    "model, config",
    [
        (FOUR, {"pp": 2, "schedule": "dualpipev", "microbatches": 4}),
        (FOUR, {"pp": 2, "schedule": "dualpipe", "microbatches": 4}),
        # more microbatches: the steady state's F&B pairs (one per microbatch past 2p)
        (FOUR, {"pp": 2, "schedule": "dualpipev", "microbatches": 8}),
        (FOUR, {"pp": 2, "schedule": "dualpipe", "microbatches": 8}),
        # four ranks on two cores: make test holds both at pp 2
        pytest.param(
            EIGHT, {"pp": 4, "schedule": "dualpipev", "microbatches": 8}, marks=pytest.mark.slow
        ),
        pytest.param(
            EIGHT, {"pp": 4, "schedule": "dualpipe", "microbatches": 8}, marks=pytest.mark.slow
        ),
    ],
    ids=[
        "dualpipev-pp2",
        "dualpipe-pp2",
        "dualpipev-pp2-m8",
        "dualpipe-pp2-m8",
        "dualpipev-pp4",
        "dualpipe-pp4",
    ],
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


# p = 2, 3, 4, 8, each at the fewest microbatches torch accepts (2p), one more, and a few more
SIZES = [(p, m) for p in (2, 3, 4, 8) for m in sorted({2 * p, 2 * p + 1, 3 * p, 20})]


# ---- torch's runtime -----------------------------------------------------------------------------
def _torchs_cells(p: int, m: int, rank: int) -> list[str]:
    """Torch's DualPipeV compute order for `rank`, as its CSV cells, without a process group: the
    generator reads only the group size and the microbatch count from `self`."""
    ns = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m)
    return [str(a) for a in ScheduleDualPipeV._calculate_single_rank_operations(ns, rank)]


@pytest.mark.parametrize("p, m", SIZES)
def test_our_dualpipev_is_torchs_action_for_action(p, m):
    """Each rank's compute order equals torch 2.13's `ScheduleDualPipeV`: the same F, B, I, W and
    F&B pairs, in the same order (torch writes a pair `(0F3;3B1)OVERLAP_F_B`, `compute_cells`
    `(0F3;3B1)`)."""
    ours = build_schedule("dualpipev", p, m)
    assert ours.placement == "v" and ours.v == 2
    for rank in range(p):
        torchs = _torchs_cells(p, m, rank)
        assert all(c.endswith(")OVERLAP_F_B") for c in torchs if c.startswith("("))
        assert any(c.startswith("(") for c in torchs), "the steady state pairs F and B"
        theirs = [c.removesuffix("OVERLAP_F_B") for c in torchs]
        assert compute_cells(ours.actions[rank]) == theirs, f"rank {rank}"


def test_the_comparison_sees_a_changed_order():
    """The check above can fail: one swapped pair of actions on one rank is not torch's order."""
    cells = compute_cells(build_schedule("dualpipev", 2, 4).actions[1])
    cells[0], cells[1] = cells[1], cells[0]
    assert cells != [c.removesuffix("OVERLAP_F_B") for c in _torchs_cells(2, 4, 1)]


def _torchs_loader(p: int, m: int) -> _PipelineScheduleRuntime:
    """A `_PipelineScheduleRuntime` holding only what its `_load_csv` reads (the group size, the
    stage and microbatch counts, no stage): the loader needs no process group, only the constructor
    does."""
    rt = _PipelineScheduleRuntime.__new__(_PipelineScheduleRuntime)
    rt.pp_group_size, rt._num_stages, rt._n_microbatches = p, 2 * p, m
    rt._stages, rt.pipeline_order, rt._defer_pp_recv = [], {}, False
    return rt


@pytest.mark.parametrize("p, m", [(2, 4), (3, 7), (4, 8), (8, 20)])
def test_our_dualpipev_csv_loads_in_torchs_runtime(tmp_path, p, m):
    """Our CSV, read by torch's `_load_csv(format="compute_only")`: torch validates it, infers the V
    (rank r: stages r and 2p − 1 − r), holds torch's own DualPipeV order, and lowers it to sends and
    receives; read back by us it is the schedule we wrote."""
    ours = build_schedule("dualpipev", p, m)
    path = str(tmp_path / "dualpipev.csv")
    write_csv(ours, path)
    rt = _torchs_loader(p, m)
    rt._load_csv(path, format="compute_only")
    assert rt.stage_index_to_group_rank == {k: min(k, 2 * p - 1 - k) for k in range(2 * p)}
    for rank in range(p):
        assert [str(a) for a in rt.pipeline_order[rank]] == _torchs_cells(p, m, rank)
        kinds = {a.computation_type.name for a in rt.pipeline_order_with_comms[rank]}
        assert {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "OVERLAP_F_B"} <= kinds, rank
    back = read_csv(path, m)
    assert back.actions == ours.actions and back.placement == "v"


def test_torchs_loader_refuses_a_broken_dualpipev(tmp_path):
    """The loader is a check that can fail: a row missing one backward is refused."""
    path = tmp_path / "broken.csv"
    write_csv(build_schedule("dualpipev", 2, 4), str(path))
    rows = path.read_text().splitlines()
    assert ",1B2," in rows[1]
    rows[1] = rows[1].replace(",1B2,", ",")
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(AssertionError, match="backward microbatches for stage 1"):
        _torchs_loader(2, 4)._load_csv(str(path), format="compute_only")
