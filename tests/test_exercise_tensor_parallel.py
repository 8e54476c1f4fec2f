"""Exercise `tensor-parallel`: the reference answer passes on real ranks beside one process; a missing g, a
missing f and w1 split by its columns are named on simulated ranks before any process starts; summing the
hidden layer instead of the output is correct on real ranks and fails the target, measured from the trace.

A solution runs on the ranks from its source with only `torch` and `math` as globals: the wrong answers below
spell torch.nn.functional out."""

from __future__ import annotations

import torch

import workbench as wb
from workbench.exercises import answers
from workbench.exercises.tensor_parallel import ACTIVATION_BYTES, EXERCISE
from workbench.exercises.tp_diagnosis import diagnose
from workbench.exercises.tp_simulation import simulate


def check(solution, tmp_path):
    return wb.exercises.check("tensor-parallel", solution, out=str(tmp_path))


def before_any_process(result, tmp_path) -> str:
    """The check stopped at validate, and no rank was launched."""
    assert not result.passed
    assert result.stage == "validate", result
    assert not (tmp_path / "yours").exists()
    assert result.message.startswith("on 2 simulated ranks, before any process started: ")
    return result.message


def test_the_reference_answer_equals_one_process_with_one_all_reduce_each_way(tmp_path):
    result = check(answers.tp_mlp, tmp_path)
    assert result.passed, result
    rows = {row.what: row for row in result.rows}
    assert all(row.ok is not False for row in result.rows)
    for direction in ("forward", "backward"):
        counted = rows[f"bytes all-reduced per MLP, {direction}"]
        assert counted.measured and counted.yours == ACTIVATION_BYTES == 12 * 16 * 8
        assert (
            rows[[w for w in rows if w.startswith(f"all-reduces per MLP, {direction}")][0]].yours
            == 1
        )
    assert result.figure() is not None  # the learner's timeline beside the reference's


def test_a_missing_g_leaves_each_rank_its_partial_sum(tmp_path):
    def tp_mlp(x, w1, w2, tp):
        per = w1.size(0) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        return torch.nn.functional.gelu(tp.f(x) @ w1[mine].t()) @ w2[:, mine].t()

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert "rank 0's output is a partial sum over its 32 of the 64 hidden units (0–31)" in message
    assert "g, the all-reduce after the row-parallel matmul, is missing" in message


def test_a_missing_f_leaves_each_rank_its_own_units_share_of_xs_gradient(tmp_path):
    def tp_mlp(x, w1, w2, tp):
        per = w1.size(0) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        return tp.g(torch.nn.functional.gelu(x @ w1[mine].t()) @ w2[:, mine].t())

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert "the output is right, but x's gradient on rank 0 holds only the contribution" in message
    assert "f's backward all-reduce is missing" in message


def test_w1_split_by_its_columns_is_a_shape_error_that_teaches_the_split(tmp_path):
    def tp_mlp(x, w1, w2, tp):
        per = w1.size(1) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        hidden = torch.nn.functional.gelu(tp.f(x) @ w1[:, mine].t())
        return tp.g(hidden @ w2[:, mine].t())

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert (
        "rank 0 raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (12x16 and 8x64)"
        in message
    )
    assert "line 4 of your function" in message
    assert "Column-parallel (the first layer) splits w1's output features, its rows" in message


def test_gelu_of_partial_sums_is_read_from_the_columns_each_rank_used(tmp_path):
    """w1 split by its input features, x with it: each rank's GELU sees a partial sum."""

    def tp_mlp(x, w1, w2, tp):
        per = x.size(1) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        hidden = torch.nn.functional.gelu(tp.f(x)[:, mine] @ w1[:, mine].t())
        return tp.g(hidden @ w2.t()) / tp.size

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert (
        "rank 0 used columns 0–7 of w1, its input features: that is a row-parallel split" in message
    )
    assert "gelu(a) + gelu(b) ≠ gelu(a + b)" in message


def test_gelu_after_g_and_calls_the_ranks_do_not_share_are_named():
    def gelu_after_g(x, w1, w2, tp):
        per = w1.size(0) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        return torch.nn.functional.gelu(tp.g(tp.f(x) @ w1[mine].t() @ w2[:, mine].t()))

    def g_on_rank_0(x, w1, w2, tp):
        per = w1.size(0) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        y = torch.nn.functional.gelu(x @ w1[mine].t()) @ w2[:, mine].t()
        return tp.g(y) if tp.rank == 0 else y

    assert "GELU was applied after g" in str(diagnose(simulate(gelu_after_g), gelu_after_g))
    waits = diagnose(simulate(g_on_rank_0), g_on_rank_0)
    assert waits is not None and waits.startswith(
        "deadlock: rank 0 waits at its all-reduce number 1 (g's all-reduce in forward) while the ranks made "
        "[1, 0] all-reduces in all"
    )


def test_any_split_of_the_hidden_units_is_correct_on_simulated_ranks():
    """Every other hidden unit per rank computes the same MLP; so does summing the hidden layer (correct:
    only the target, on real ranks, tells it from the reference)."""

    def interleaved(x, w1, w2, tp):
        mine = slice(tp.rank, None, tp.size)
        return tp.g(torch.nn.functional.gelu(tp.f(x) @ w1[mine].t()) @ w2[:, mine].t())

    for t in (2, 4):
        assert diagnose(simulate(interleaved, t), interleaved) is None
        assert diagnose(simulate(answers.tp_mlp, t), answers.tp_mlp) is None


def test_f_and_g_swapped_is_named_from_the_input_g_summed(tmp_path):
    def tp_mlp(x, w1, w2, tp):
        per = w1.size(0) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        hidden = torch.nn.functional.gelu(tp.g(x) @ w1[mine].t())  # g where f belongs
        return tp.f(hidden @ w2[:, mine].t())  # f where g belongs

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert "rank 0's output is the MLP of t·x = 2·x: g was applied to the input" in message
    assert "f goes before the first linear" in message and "g after the second" in message
    assert "tanh" not in message  # the GELU hint only where the output is the tanh GELU's


def test_the_whole_mlp_on_every_rank_is_named_as_no_split(tmp_path):
    def tp_mlp(x, w1, w2, tp):
        y = torch.nn.functional.gelu(tp.f(x) @ w1.t()) @ w2.t()
        return tp.g(y) / tp.size  # right, and every rank computed every hidden unit

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert "every rank computed all 64 hidden units (rows of w1): no split happened" in message
    assert "each rank computes its own 4h/t = 32" in message


def test_the_tanh_gelu_is_named_and_a_fixed_degree_fails_at_four(tmp_path):
    def tanh_gelu(x, w1, w2, tp):
        per = w1.size(0) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        hidden = torch.nn.functional.gelu(tp.f(x) @ w1[mine].t(), approximate="tanh")
        return tp.g(hidden @ w2[:, mine].t())

    def two_ranks(x, w1, w2, tp):
        per = w1.size(0) // 2  # a fixed 2 where tp.size belongs
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        return tp.g(torch.nn.functional.gelu(tp.f(x) @ w1[mine].t()) @ w2[:, mine].t())

    tanh = before_any_process(check(tanh_gelu, tmp_path), tmp_path)
    assert "it is the MLP with GELU's tanh approximation" in tanh
    fixed = check(two_ranks, tmp_path)
    assert fixed.stage == "validate" and not (tmp_path / "yours").exists()
    assert fixed.message == (
        "on 4 simulated ranks (it passed on 2: does it use tp.size, not a number?), before any process "
        "started: the output is right, but your 4 ranks computed [32, 32, 0, 0] hidden units (rows of w1): "
        "each computes its own 4h/t = 64 / 4 = 16. Cut by tp.size and tp.rank, not by a fixed number of ranks."
    )


def test_a_loop_without_end_is_stopped_at_its_all_reduces(tmp_path):
    def tp_mlp(x, w1, w2, tp):
        while True:
            x = tp.g(x)

    message = before_any_process(check(tp_mlp, tmp_path), tmp_path)
    assert (
        "rank 0 made more than 2 all-reduces (g forward, f backward) in one forward and backward (it was "
        "stopped at 8): a loop that does not end?" in message
    )


def test_summing_the_hidden_layer_is_correct_and_fails_the_target(tmp_path):
    """w1 split by its input features with the all-reduce before GELU: right, at 4 × the bytes forward."""

    def tp_mlp(x, w1, w2, tp):
        per = x.size(1) // tp.size
        mine = slice(tp.rank * per, (tp.rank + 1) * per)
        pre = tp.g(tp.f(x)[:, mine] @ w1[:, mine].t())  # [tokens, 4h], summed
        return torch.nn.functional.gelu(pre) @ w2.t()

    assert diagnose(simulate(tp_mlp), tp_mlp) is None
    result = check(tp_mlp, tmp_path)
    assert not result.passed and result.stage == "target", result
    assert (
        "each step all-reduced 6144 bytes in forward (1 all-reduce) and 1536 in backward"
        in result.message
    )
    rows = {row.what: row for row in result.rows}
    forward = rows["bytes all-reduced per MLP, forward"]
    assert (forward.yours, forward.ok, forward.measured) == (4 * ACTIVATION_BYTES, False, True)
    assert rows["bytes all-reduced per MLP, backward"].ok
    assert result.rows[0].ok  # equal to one process


def shipped_cell(tmp_path):
    """The stub as a notebook cell defines it (from a file, so that its source can be read back)."""
    path = tmp_path / "cell.py"
    path.write_text(EXERCISE.stub)
    namespace: dict = {}
    exec(compile(EXERCISE.stub, str(path), "exec"), namespace)
    return namespace["tp_mlp"]


def test_the_stub_as_shipped_and_a_lambda_are_refused_before_any_process(tmp_path):
    """The stub's def has the reference answer's name (the notebook calls it); unfilled, it returns None."""
    assert answers.ANSWERS["tensor-parallel"].__name__ == "tp_mlp"
    message = before_any_process(check(shipped_cell(tmp_path), tmp_path), tmp_path)
    assert "tp_mlp returned NoneType" in message
    refused = check(lambda x, w1, w2: x, tmp_path)
    assert refused.stage == "validate" and "`def tp_mlp(x, w1, w2, tp): ...`" in refused.message


class RecordedRun:
    """What `judge` reads of a run — each rank's exercise_rank{r}.json, the trace's events, the config —
    written by hand, to hold the judge to what real ranks could report."""

    def __init__(self, path, *, worst: float, all_reduces: bool) -> None:
        import json

        import pandas as pd

        self.path, self.config = str(path), wb.RunConfig(tp=2, global_batch=1).to_dict()
        keys = ("output", "x gradient", "w1 gradient", "w2 gradient", "losses")
        for r in range(2):
            found = {"worst": dict.fromkeys(keys, 1e-15) | {"output": worst}, "losses": [7.0] * 3}
            found["one_process_losses"] = [7.0] * 3
            (path / f"exercise_rank{r}.json").write_text(json.dumps(found))
        rows = [
            {"rank": r, "step": s, "name": f"ProfilerStep#{s}", "cat": "step", "dur_us": 1e3}
            for r in range(2)
            for s in range(3)
        ]
        if all_reduces:
            rows += [
                {"rank": r, "step": s, "name": f"all_reduce {label}", "cat": "collective", "op": "all_reduce",
                 "group": "tp", "label": label, "bytes": ACTIVATION_BYTES, "dur_us": 10.0}
                for r in range(2)
                for s in range(3)
                for label in ("g forward", "f backward")
            ]  # fmt: skip
        columns = ["rank", "step", "name", "cat", "op", "group", "label", "bytes", "dur_us"]
        self.events = pd.DataFrame(rows, columns=columns)  # a run's events have every column


def test_the_judge_holds_real_ranks_to_one_process_and_to_communicating(tmp_path):
    from workbench.exercises.tensor_parallel import judge

    reference = RecordedRun(tmp_path, worst=1e-15, all_reduces=True)
    assert judge(reference, reference).passed
    (tmp_path / "off").mkdir()
    off = judge(RecordedRun(tmp_path / "off", worst=0.5, all_reduces=True), reference)
    assert off.stage == "one process"
    assert off.message.startswith("on the real ranks the output differs from one process's by 0.5")
    (tmp_path / "alone").mkdir()
    alone = judge(RecordedRun(tmp_path / "alone", worst=0.0, all_reduces=False), reference)
    assert alone.stage == "target" and "the ranks never communicated" in alone.message
