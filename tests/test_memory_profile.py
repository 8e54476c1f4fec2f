"""The memory categories against the allocator (--profile-memory on CPU: torch.profiler's memory events).

At every snapshot of the profiled step, the categories must explain at least 85 % of the bytes the CPU
allocator holds, and never exceed them by more than 2 % (over-counting is a bug too). Beside the
categories, the profile itself attributes what the communication backend's own threads allocated
(gloo gathers an all-gather into a flat buffer on its worker thread, from whenever that thread takes
the operation until it ends — a window no booking on the main thread can follow: on 2 cores it starts
up to milliseconds after the launch). What is left is shown as `unattributed`: the input batch and
layers' short-lived intermediates.
"""

import os

import pytest

from workbench import ConfigError, RunConfig

PROFILED = {
    "model": "small",
    "dp": 2,
    "global_batch": 8,
    "steps": 3,
    "profile_memory": True,
    "profile_memory_step": 1,
}


def _paired(run, rank):
    """(categories' sum + the backend threads' live bytes, allocator's live bytes) at each snapshot the
    allocator was read."""
    trace = next(t for t in run.traces if t["distributedInfo"]["rank"] == rank)
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    totals = {e["ts"]: sum(e["args"].values()) for e in counters if e["name"] == "memory"}
    return [
        (totals[e["ts"]] + e["args"]["backend_threads"], e["args"]["allocated"])
        for e in counters
        if e["name"] == "allocator" and e["ts"] in totals
    ]


@pytest.mark.parametrize(
    "zero", [0, pytest.param(3, marks=pytest.mark.slow)], ids=["dp2", "dp2-zero3"]
)
def test_the_categories_explain_what_the_allocator_holds(launched, zero):
    run = launched(zero=zero, **PROFILED)
    for rank in range(2):
        pairs = _paired(run, rank)
        assert len(pairs) >= 10, "the profiled step's snapshots carry the allocator's figure"
        # gloo's reduce-scatter all-reduces a clone of its input on a worker thread and keeps our slice of it
        # (the clone is booked as comm_buffer until the wait); the inner all-reduce can hold the clone well
        # after the wait returns: in about 1 run in 8 here one rank still held one at the step's end (the
        # profile shows the block, allocated inside c10d::_reduce_scatter_base_). At most that one copy, the
        # largest reduce-scatter input, may go unexplained.
        rs = run.events[(run.events["rank"] == rank) & (run.events.op == "reduce_scatter")]
        straggler = 0 if rs.empty else rs.bytes.max()
        for categories, allocated in pairs:
            assert categories + straggler >= 0.85 * allocated, (rank, categories, allocated)
            assert categories <= 1.02 * allocated, (rank, categories, allocated)
        r = run.summary["ranks"][rank]
        assert r["allocator_peak_bytes"]["allocated"] >= r["peak_total_bytes"] * 0.98
        assert r["unattributed_bytes"] >= -0.02 * r["allocator_peak_bytes"]["allocated"]
        assert os.path.exists(os.path.join(run.path, f"memory_profile_rank{rank}.json")), (
            "the profile is kept"
        )


def test_activations_are_released_as_backward_consumes_them(launched):
    """The activation counter falls in many steps during backward (not once at its end), and the
    step's peak is the forward's end."""
    run = launched(zero=0, **PROFILED)
    ev = run.events
    back = ev[(ev["rank"] == 0) & (ev.cat == "backward")].iloc[1]
    mem = run.memory[run.memory["rank"] == 0]
    during = mem[(mem.ts_us >= back.start_us) & (mem.ts_us <= back.end_us)].activation
    assert (during.diff() < 0).sum() >= 8, during.tolist()
    assert during.iloc[-1] < 0.2 * during.max()


def test_the_profiled_step_must_be_one_of_the_run():
    with pytest.raises(ConfigError, match="profile_memory_step=5"):
        RunConfig(steps=3, profile_memory=True, profile_memory_step=5).validate()
