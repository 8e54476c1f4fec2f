"""The ring exercise (workbench/exercises/ring.py): the reference answer passes on real ranks; typical wrong
answers fail with the message that teaches — most on the simulated ranks, before any process starts, and the
one that is only visible on the wire (whole buffers sent) on real ranks, at the bytes target."""

from __future__ import annotations

import torch

import workbench as wb
from workbench.exercises import answers


def test_the_reference_answer_passes_on_real_ranks(tmp_path):
    result = wb.exercises.check("ring", answers.ring_all_reduce, out=str(tmp_path))
    assert result.passed, str(result)
    assert result.learner is not None and result.reference is not None
    rows = {r.what: r for r in result.rows}
    # 4 ranks, 4 chunks of 256 float64: 2(n−1)/n·S = 1.5 × 8192 bytes, summed from the trace's ring steps
    assert (
        rows["bytes a rank sent (most)"].yours == 12288
        and rows["bytes a rank sent (most)"].measured
    )
    assert result.figure() is not None


def whole_buffers(ring, chunks):
    n = ring.n
    total = torch.cat(chunks)
    mine = total.clone()
    for _ in range(n - 1):  # pass the whole buffer around: right, and n−1 times S on the wire
        mine = ring.exchange(mine)
        total += mine
    for c, part in zip(chunks, total.chunk(n), strict=True):
        c.copy_(part)


def test_whole_buffers_sum_right_and_fail_the_bytes_target_on_real_ranks(tmp_path):
    result = wb.exercises.check("ring", whole_buffers, out=str(tmp_path))
    assert not result.passed and result.stage == "target", str(result)
    assert "3.00 × the 8192-byte buffer" in result.message
    assert "each exchange carries one chunk (S/n)" in result.message
    rows = {r.what: r for r in result.rows}
    assert rows["every rank holds what one process sums"].ok


def adds_in_the_all_gather(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1):
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):
        chunks[(i - k) % n] += ring.exchange(chunks[(i + 1 - k) % n])


def test_adding_in_the_all_gather_is_named_a_double_count():
    result = wb.exercises.check("ring", adds_in_the_all_gather)
    assert not result.passed and result.stage == "validate"
    assert "before any process started" in result.message
    assert "counts rank 0's values 2 times" in result.message
    assert "copy it into place, do not add it" in result.message


def all_gather_off_by_one(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1):
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):  # starts from chunk i, which holds only this rank's values
        chunks[(i - k - 1) % n].copy_(ring.exchange(chunks[(i - k) % n]))


def test_an_all_gather_started_one_chunk_early_is_named_the_off_by_one():
    result = wb.exercises.check("ring", all_gather_off_by_one)
    assert not result.passed and result.stage == "validate"
    assert (
        "off by one in the ring: at exchange 3 (all-gather) rank 0 sent chunk 0" in result.message
    )
    assert "held the values of ranks {0}, 1 of 4" in result.message
    assert (
        "rank 0 holds the whole sum of chunk 1 only: start the all-gather from that chunk"
        in result.message
    )


def rank_zero_stops_early(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1 - (i == 0)):
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])


def test_a_rank_that_stops_early_is_named_where_its_neighbour_waits():
    result = wb.exercises.check("ring", rank_zero_stops_early)
    assert not result.passed and result.stage == "validate"
    assert (
        "deadlock: rank 1 waits at its exchange 2 for rank 0, which made 2 exchanges"
        in result.message
    )
    assert "[2, 3, 3, 3]" in result.message


def one_step_short(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 2):
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):
        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))


def test_a_reduce_scatter_one_step_short_is_told_the_count():
    result = wb.exercises.check("ring", one_step_short)
    assert not result.passed and result.stage == "validate"
    assert "your ranks made [5, 5, 5, 5] exchanges" in result.message
    assert "2(n−1) = 6 on each" in result.message


def indexes_past_the_end(ring, chunks):
    return chunks[ring.n]


def test_an_exception_names_the_rank_and_the_line():
    result = wb.exercises.check("ring", indexes_past_the_end)
    assert not result.passed and result.stage == "validate"
    assert "rank 0 raised IndexError" in result.message
    assert "line 2 of your function: return chunks[ring.n]" in result.message


def forgets_to_count(ring, chunks):
    n, i = ring.n, ring.rank
    k = 0
    while k < n - 1:  # k += 1 forgotten: every rank exchanges without end
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])


def test_a_loop_that_does_not_end_is_stopped_at_a_few_times_the_exchanges_it_takes():
    result = wb.exercises.check("ring", forgets_to_count)
    assert not result.passed and result.stage == "validate"
    assert (
        "rank 0 made more than 2(n−1) = 6 exchanges (it was stopped at 24): a loop that does not end?"
        in result.message
    )


def test_a_rank_that_neither_exchanges_nor_returns_ends_the_check_by_the_deadline(monkeypatch):
    import threading
    import time

    from workbench.exercises import ring, simulated_ranks

    monkeypatch.setattr(simulated_ranks, "DEADLINE_S", 4.0)
    release = threading.Event()

    def rank_one_spins(ring, chunks):
        if ring.rank == 1:
            while not release.wait(0.05):  # a loop that does not end (until the test ends it)
                pass
        answers.ring_all_reduce(ring, chunks)

    try:
        began = time.monotonic()
        message = ring.diagnose(ring.simulate(rank_one_spins), rank_one_spins)
        assert time.monotonic() - began < 8.0
    finally:
        release.set()
    assert message == (
        "rank 1 did not return within 4 s: a loop that does not end? (it still runs in this kernel; "
        "restart the kernel)"
    )


def ring_of_four(ring, chunks):
    n, i = 4, ring.rank  # a fixed 4 where ring.n belongs
    for k in range(n - 1):
        chunks[(i - k - 1) % n] += ring.exchange(chunks[(i - k) % n])
    for k in range(n - 1):
        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))


def test_a_fixed_ring_size_passes_on_four_ranks_and_fails_on_three():
    result = wb.exercises.check("ring", ring_of_four)
    assert not result.passed and result.stage == "validate"
    assert result.message.startswith(
        "on 3 simulated ranks (it passed on 4: does it use ring.n, not a number?), before any process "
        "started: rank 0 raised IndexError"
    )


def rebinds_the_chunks(ring, chunks):
    n, i = ring.n, ring.rank
    for k in range(n - 1):
        j = (i - k - 1) % n
        chunks[j] = chunks[j] + ring.exchange(
            chunks[(i - k) % n]
        )  # a new tensor: the buffer keeps its own
    for k in range(n - 1):
        chunks[(i - k) % n].copy_(ring.exchange(chunks[(i + 1 - k) % n]))


def test_chunks_replaced_instead_of_changed_in_place_are_named():
    result = wb.exercises.check("ring", rebinds_the_chunks)
    assert not result.passed and result.stage == "validate"
    assert (
        "rank 0 replaced chunks[1] with a new tensor instead of changing it in place (+=, .copy_): the "
        "buffer is what must hold the sum" in result.message
    )


def helper(ring, chunks):
    answers.ring_all_reduce(ring, chunks)


def uses_a_helper_from_another_cell(ring, chunks):
    helper(ring, chunks)


def test_a_helper_from_another_cell_fails_in_this_process_as_it_would_on_the_ranks():
    result = wb.exercises.check("ring", uses_a_helper_from_another_cell)
    assert not result.passed and result.stage == "validate"
    assert "rank 0 raised NameError: name 'helper' is not defined" in result.message
    assert "(line 2 of your function: helper(ring, chunks))" in result.message
    assert (
        "your function runs with only torch and math as its globals (on the ranks too): define or import "
        "what it uses inside it" in result.message
    )
