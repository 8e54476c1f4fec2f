"""DualPipe and DualPipeV (DeepSeek-V3, 2024; workbench/schedules/dualpipe.py): bidirectional pipelines as
data — validated for every pp and microbatches they accept and refused elsewhere, their F&B pairs issued
as one step, their idle time DeepSeek's formula —, held to torch's `ScheduleDualPipeV`, to torch's runtime,
and to one process.

Our DualPipeV CSV training in torch's `_PipelineScheduleRuntime` (CPU, gloo) as one process trains
is tests/test_zero_bubble.py's `test_torchs_runtime_runs_our_zbh1_and_dualpipev_and_we_run_torchs_...`:
one torchrun launch runs both CSVs against one single-process reference, so the case costs seconds.
"""

import dataclasses
import os
import types

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _PipelineScheduleRuntime

from tests.test_data_parallel import assert_same_training
from workbench import ConfigError, ModelConfig, RunConfig
from workbench.cli import main as cli
from workbench.predict.formulas.zero_bubble import dualpipe_bubble
from workbench.schedules.actions import P2PBatch, compute_cells, flatten
from workbench.schedules.build import build_schedule, peak_in_flight, simulate, validate
from workbench.schedules.dualpipe import dualpipe_orders, dualpipev_orders
from workbench.schedules.torch_csv import read_csv, write_csv


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
        ({"schedule": "dualpipev", "pp": 2, "microbatches": 2}, "valid: 4 or more"),
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
    stage 1/p of a copy) and DualPipeV (PP = 2p, each stage half a rank's share), whether the pair costs
    F + B (one thread, nothing overlaps) or less (a GPU overlapping them)."""
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


@pytest.mark.parametrize("p", [2, 4, 8])
def test_activations_in_flight_are_deepseeks_pp_plus_one(p):
    """DeepSeek's table: PP + 1 stages' worth of microbatches on a rank — DualPipe p + 1 (its stages are
    whole parts), DualPipeV 2p + 1 chunks (half a rank's share each); ZBV holds 2p."""
    assert max(peak_in_flight(build_schedule("dualpipe", p, 4 * p))) == p + 1
    assert max(peak_in_flight(build_schedule("dualpipev", p, 4 * p))) == 2 * p + 1
    assert max(peak_in_flight(build_schedule("zbv", p, 4 * p))) == 2 * p


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


def test_dp2_dualpipev_trains_the_same_model_as_one_process(launched):
    """Four ranks: the data-parallel buckets launch once per chunk after its last gradient (above)."""
    model = ModelConfig(layers=4)
    run = launched(model=model, dp=2, pp=2, schedule="dualpipev", microbatches=4, bucket_mb=0.02)
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
