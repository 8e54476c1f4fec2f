"""The ZeRO-1 exercise: the reference answer trains what one process does on 4 real ranks, with plain data
parallelism's bytes on the wire and 1/4 of the optimizer state; the typical wrong answers are named — the
missing average, the wrong shard and the missing all-gather on simulated ranks before any process starts, the
all-reduce (correct, 3(n−1)/n·S on the wire) and the whole-model update (correct, n× the state) on real ranks
against the measured targets."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

import workbench as wb
from workbench.analysis.run import load
from workbench.config import RunConfig
from workbench.exercises import answers, zero1
from workbench.exercises.ranks import run_on_ranks
from workbench.exercises.submission import function_source
from workbench.exercises.zero1_simulated import RANKS, diagnose, simulate


@pytest.fixture(scope="module")
def passed(tmp_path_factory: pytest.TempPathFactory) -> wb.exercises.Result:
    """The reference answer checked end to end: simulated, then yours and the reference on real ranks."""
    return wb.exercises.check(
        "zero1", answers.zero1_step, out=str(tmp_path_factory.mktemp("zero1"))
    )


def _rows(result: wb.exercises.Result) -> dict[str, wb.exercises.Row]:
    return {row.what.split(",")[0].split(" (")[0]: row for row in result.rows}


def _on_real_ranks(fn, reference_run, out: str) -> wb.exercises.Result:
    """A solution that the simulation passes, run on the real ranks and judged beside the reference's run."""
    source = function_source(
        fn, function="zero1", params=("flat_params", "flat_grads", "dp", "update")
    )
    run = run_on_ranks(
        "zero1",
        config=RunConfig(dp=RANKS, global_batch=RANKS),
        solution=source,
        settings={"label": "yours"},
        out=out,
    )
    return zero1.judge(run, reference_run)


def test_the_reference_trains_what_one_process_does_with_plain_dps_bytes_and_a_quarter_of_the_state(
    passed: wb.exercises.Result,
) -> None:
    assert passed.passed, str(passed)
    rows = _rows(passed)
    size = 4 * 1072  # the MLP's 1072 fp32 values (16·32 + 32 + 32·16 + 16)
    assert rows["bytes a rank sent a step"].yours == 2 * 3 * size // 4
    assert rows["bytes a rank sent a step"].measured
    assert rows["optimizer state a rank holds"].yours == 2 * size // 4
    # fp32's reordering only: measured ~5e-8 (losses) and ~1e-7 (parameters), well inside the 1e-5 held
    assert rows["losses against one process"].yours < 1e-6
    assert rows["final parameters against one process"].yours < 1e-6
    ev = passed.learner.events
    ops = set(ev[ev.cat == "collective"].op)
    assert {"reduce_scatter", "all_gather"} <= ops and "all_reduce" not in ops
    assert "ZeRO-1 costs no extra communication" in passed.message
    assert passed.figure() is not None  # the learner's timeline beside the reference's


def _no_average(flat_params, flat_grads, dp, update):
    n, r = dp.size, dp.rank
    per = flat_params.numel() // n
    grads = torch.empty(per)
    dp.reduce_scatter(grads, flat_grads)
    update(flat_params[r * per : (r + 1) * per], grads)
    dp.all_gather(flat_params, flat_params[r * per : (r + 1) * per].clone())


def _no_all_gather(flat_params, flat_grads, dp, update):
    n, r = dp.size, dp.rank
    per = flat_params.numel() // n
    grads = torch.empty(per)
    dp.reduce_scatter(grads, flat_grads / n)
    update(flat_params[r * per : (r + 1) * per], grads)


def _next_ranks_shard(flat_params, flat_grads, dp, update):
    n, r = dp.size, dp.rank
    per = flat_params.numel() // n
    grads = torch.empty(per)
    dp.reduce_scatter(grads, flat_grads / n)
    s = (r + 1) % n
    update(flat_params[s * per : (s + 1) * per], grads)
    dp.all_gather(flat_params, flat_params[s * per : (s + 1) * per].clone())


@pytest.mark.parametrize(
    "wrong, words",
    [
        (
            _no_average,
            ["sum of the ranks' gradients, 4× one process's", "rank 0", "divide by dp.size"],
        ),
        (
            _no_all_gather,
            [
                "rank 0 holds 192 of 256 values as they were before the step",
                "outside its own slice [0, 64)",
                "all-gather the shards",
            ],
        ),
        (
            _next_ranks_shard,
            ["rank 0 updated elements [64, 128) (slice 1) but owns elements [0, 64) (slice 0)"],
        ),
    ],
    ids=["forgot-the-average", "no-all-gather", "wrong-shard"],
)
def test_a_wrong_step_is_named_on_simulated_ranks_before_any_process_starts(
    wrong, words: list[str], tmp_path
) -> None:
    result = wb.exercises.check("zero1", wrong, out=str(tmp_path))
    assert not result.passed and result.stage == "validate", str(result)
    for w in words:
        assert w in result.message, result.message
    assert not os.path.exists(tmp_path / "yours")  # no process started


def test_a_deadlock_names_the_ranks_collectives(tmp_path) -> None:
    def gather_on_some(flat_params, flat_grads, dp, update):
        per = flat_params.numel() // dp.size
        mine = slice(dp.rank * per, (dp.rank + 1) * per)
        grads = torch.empty(per)
        dp.reduce_scatter(grads, flat_grads / dp.size)
        update(flat_params[mine], grads)
        if dp.rank:
            dp.all_gather(flat_params, flat_params[mine].clone())

    result = wb.exercises.check("zero1", gather_on_some, out=str(tmp_path))
    assert result.stage == "validate" and "deadlock" in result.message
    assert "rank 0: reduce_scatter;" in result.message


def _sized_for_four(flat_params, flat_grads, dp, update):
    n, r = 4, dp.rank  # a fixed 4 where dp.size belongs
    per = flat_params.numel() // n
    mine = slice(r * per, (r + 1) * per)
    grads = torch.empty(per)
    dp.reduce_scatter(grads, flat_grads)
    update(flat_params[mine], grads / n)
    dp.all_gather(flat_params, flat_params[mine].clone())


def _reduces_without_end(flat_params, flat_grads, dp, update):
    while True:  # the loop's way out forgotten
        dp.all_reduce(flat_grads)


def test_a_fixed_size_and_a_loop_without_end_are_named_before_any_process(tmp_path) -> None:
    fixed = wb.exercises.check("zero1", _sized_for_four, out=str(tmp_path))
    assert fixed.stage == "validate"
    assert fixed.message.startswith(
        "on 3 simulated ranks (it passed on 4: does it use dp.size, not a number?), before any process "
        "started: rank 0 raised ValueError: dp.reduce_scatter(out, inp): inp has 192 values, out 48"
    )
    endless = wb.exercises.check("zero1", _reduces_without_end, out=str(tmp_path))
    assert endless.stage == "validate"
    assert (
        "rank 0 made more than 2 collectives (a reduce-scatter, an all-gather) in one step (it was "
        "stopped at 8): a loop that does not end?" in endless.message
    )
    assert not os.path.exists(tmp_path / "yours")  # no process started


def test_a_function_with_the_wrong_arguments_is_refused_before_anything_runs(tmp_path) -> None:
    def step(flat_params, flat_grads):
        pass

    result = wb.exercises.check("zero1", step, out=str(tmp_path))
    assert result.stage == "validate"
    assert "`def zero1_step(flat_params, flat_grads, dp, update): ...`" in result.message


def _all_reduce_then_shard(flat_params, flat_grads, dp, update):
    n, r = dp.size, dp.rank
    per = flat_params.numel() // n
    mine = slice(r * per, (r + 1) * per)
    dp.all_reduce(flat_grads)
    update(flat_params[mine], flat_grads[mine] / n)
    dp.all_gather(flat_params, flat_params[mine].clone())


def _whole_model_on_every_rank(flat_params, flat_grads, dp, update):
    dp.all_reduce(flat_grads)
    update(flat_params, flat_grads / dp.size)


def test_all_reducing_the_gradients_is_correct_and_sends_half_as_much_again(
    passed: wb.exercises.Result, tmp_path
) -> None:
    # correct: the simulation cannot tell it from ZeRO-1; the bytes on the real ranks' trace can
    sim = simulate(_all_reduce_then_shard)
    assert diagnose(sim, _all_reduce_then_shard) is None
    result = _on_real_ranks(_all_reduce_then_shard, passed.reference, str(tmp_path / "yours"))
    assert not result.passed and result.stage == "target", str(result)
    size = 4 * 1072
    assert f"a rank sent {3 * 3 * size // 4} bytes a step, 2.25 × the model's" in result.message
    assert "reduce-scatter the gradients" in result.message
    assert not _rows(result)["bytes a rank sent a step"].ok


def test_updating_the_whole_model_on_every_rank_is_plain_dp_and_holds_n_times_the_state(
    passed: wb.exercises.Result, tmp_path
) -> None:
    result = _on_real_ranks(_whole_model_on_every_rank, passed.reference, str(tmp_path / "yours"))
    assert not result.passed and result.stage == "target", str(result)
    assert _rows(result)["bytes a rank sent a step"].ok  # plain DP's all-reduce: the same bytes
    assert "a rank holds 8576 bytes of optimizer state" in result.message
    assert "1/n = 2144 bytes a rank" in result.message


def test_real_ranks_whose_losses_drift_from_one_process_fail_against_it(
    passed: wb.exercises.Result, tmp_path
) -> None:
    """The one-process check has teeth: the reference's run with its losses moved by 1e-4 fails it."""
    assert passed.learner is not None
    drifted = str(tmp_path / "drifted")
    shutil.copytree(passed.learner.path, drifted)
    for r in range(RANKS):
        path = os.path.join(drifted, f"exercise_rank{r}.json")
        with open(path) as f:
            found = json.load(f)
        found["losses"] = [x * (1 + 1e-4) for x in found["losses"]]
        with open(path, "w") as f:
            json.dump(found, f)
    result = zero1.judge(load(drifted), passed.reference)
    assert result.stage == "one process"
    assert "losses differ by up to 0.0001 relative" in result.message
