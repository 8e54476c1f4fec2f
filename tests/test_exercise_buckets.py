"""Exercise `buckets`: the reference hook trains on dp = 2 real ranks what one process trains on the whole
batch, with every bucket launched once and during backward; the typical wrong hooks are named — a launch
per gradient, a launch before the bucket is full, a bucket never launched or written after its launch — in
this process before any rank starts, and a forgotten division by dp.size (one process) or launches held back
until backward ends (the overlap target) on real ranks."""

from __future__ import annotations

import importlib.util

import pytest

import workbench as wb
from workbench.exercises import answers, buckets


def launch_per_gradient(param, dp):
    param.grad.div_(dp.size)
    dp.all_reduce(dp.bucket_of(param))


def launch_one_early(param, dp):
    bucket = dp.bucket_of(param)
    bucket.ready.add(param)
    param.grad.div_(dp.size)
    if len(bucket.ready) == len(bucket.params) - 1:
        dp.all_reduce(bucket)


def count_after_the_check(param, dp):
    bucket = dp.bucket_of(param)
    param.grad.div_(dp.size)
    if len(bucket.ready) == len(bucket.params):
        dp.all_reduce(bucket)
    bucket.ready.add(param)


def divide_after_launch(param, dp):
    bucket = dp.bucket_of(param)
    bucket.ready.add(param)
    if len(bucket.ready) == len(bucket.params):
        dp.all_reduce(bucket)
        for p in bucket.params:
            p.grad.div_(dp.size)


def forget_to_average(param, dp):
    bucket = dp.bucket_of(param)
    bucket.ready.add(param)
    if len(bucket.ready) == len(bucket.params):
        dp.all_reduce(bucket)


def launch_after_backward(param, dp):
    param.grad.div_(dp.size)
    dp.bucket_of(param).ready.add(param)
    if all(len(b.ready) == len(b.params) for b in dp.buckets):
        for b in dp.buckets:
            dp.all_reduce(b)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The reference answer checked as a learner's: two launches, shared by the real-rank tests."""
    return wb.exercises.check(
        "buckets", answers.on_gradient, out=str(tmp_path_factory.mktemp("buckets"))
    )


def test_the_reference_hook_trains_what_one_process_trains_and_overlaps_backward(reference):
    assert reference.passed, str(reference)
    rows = {r.what: r for r in reference.rows}
    assert all(r.ok for r in reference.rows if r.ok is not None), str(reference)
    assert rows["bytes all-reduced per rank and step"].yours == 4 * sum(
        p.numel() for p in buckets.model().parameters()
    )
    assert reference.figure() is not None  # the learner's timeline beside the reference's


def test_a_launch_per_gradient_is_named_as_the_bucket_reduced_many_times(tmp_path):
    r = wb.exercises.check("buckets", launch_per_gradient, out=str(tmp_path))
    assert (r.passed, r.stage) == (False, "validate")
    assert "bucket 0 was reduced 7 times in one backward" in r.message
    assert "launched when 1, 2, 3, 4, 5, 6, 7 of its 7 gradients" in r.message
    assert "before any process started" in r.message


def test_a_bucket_launched_before_its_last_gradient_is_named_with_what_was_missing(tmp_path):
    r = wb.exercises.check("buckets", launch_one_early, out=str(tmp_path))
    assert (r.passed, r.stage) == (False, "validate")
    assert "bucket 0 was launched when 6 of its 7 gradients had arrived" in r.message
    assert "still to come: blocks.1.mlp.fc.bias" in r.message


def test_a_bucket_never_launched_and_one_written_after_launch_are_caught_before_the_ranks():
    never = buckets.validate(count_after_the_check)[1]
    assert never is not None and "bucket 0 was never launched" in never
    late = buckets.validate(divide_after_launch)[1]
    assert late is not None and "bucket 0's gradients changed after dp.all_reduce launched" in late


def replace_the_gradient(param, dp):
    bucket = dp.bucket_of(param)
    param.grad = param.grad / dp.size
    bucket.ready.add(param)
    if len(bucket.ready) == len(bucket.params):
        dp.all_reduce(bucket)


def test_a_gradient_replaced_instead_of_divided_in_place_is_named():
    found = buckets.validate(replace_the_gradient)[1]
    assert found is not None and "the gradient of head.bias is no longer a view" in found
    assert "param.grad.div_(dp.size)" in found


def test_the_shipped_empty_cell_runs_and_is_told_that_no_bucket_was_launched(tmp_path):
    path = tmp_path / "stub.py"
    path.write_text(buckets.EXERCISE.stub)
    spec = importlib.util.spec_from_file_location("stub", path)
    assert spec is not None and spec.loader is not None
    stub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stub)
    found = buckets.validate(stub.on_gradient)[1]
    assert found is not None and "bucket 0 was never launched" in found
    assert "bucket.ready held 0" in found


def test_a_hook_that_raises_names_its_line():
    def wrong_argument(param, dp):
        dp.all_reduce(param)

    found = buckets.validate(wrong_argument)[1]
    assert found is not None and "line 2 of your function: dp.all_reduce(param)" in found
    assert "dp.all_reduce takes a bucket" in found


def beside_the_reference(fn, reference, out) -> wb.exercises.Result:
    """A hook that passes the in-process check, run on real ranks and judged beside the reference's run."""
    source, wrong = buckets.validate(fn)
    assert source is not None, wrong
    return buckets.judge(buckets.run(source, str(out), "yours"), reference.reference)


def test_forgetting_to_average_trains_another_model_than_one_process(reference, tmp_path):
    r = beside_the_reference(forget_to_average, reference, tmp_path)
    assert (r.passed, r.stage) == (False, "one process")
    assert "stepped with 2 × one process's gradient" in r.message
    assert "divide each by dp.size, once and before the launch" in r.message


def test_launching_every_bucket_after_backward_is_correct_and_misses_the_overlap(
    reference, tmp_path
):
    r = beside_the_reference(launch_after_backward, reference, tmp_path)
    assert (r.passed, r.stage) == (False, "target")
    assert "only 0 of the 5 were launched before backward's last gradient" in r.message
    rows = {x.what: x for x in r.rows}
    assert rows["losses vs one process, worst relative difference over 4 steps"].ok


def divide_by_two(param, dp):
    bucket = dp.bucket_of(param)
    param.grad.div_(2)  # a fixed 2 where dp.size belongs: the real run has 2 ranks
    bucket.ready.add(param)
    if len(bucket.ready) == len(bucket.params):
        dp.all_reduce(bucket)


def test_a_fixed_divisor_fails_where_dp_size_is_another_number():
    found = buckets.validate(divide_by_two)[1]
    assert found == (
        "on one simulated backward, before any process started: bucket 0's gradients reached "
        "dp.all_reduce divided by 2; dp.size is 3 here (this check simulates 3 ranks, the real run 2): "
        "divide by dp.size, so that the sum over the ranks is their mean whatever their number"
    )
    assert buckets.validate(answers.on_gradient)[1] is None
    assert (
        buckets.validate(forget_to_average)[1] is None
    )  # left to the real ranks: one process names it
