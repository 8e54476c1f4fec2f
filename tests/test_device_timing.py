"""Communication timed on the device (the CUDA path of comm/traced.py and comm/handle.py), proven on a CPU:
a fake clock stands in for CUDA events, whose device time here is the host's (shifted, where a test needs
the device to run ahead of the host). On a GPU, tests/gpu/ runs the real thing."""

import gc
import json
import os
import time
import weakref

import pytest

from tests.distributed import make_comm, run_ranks
from workbench.comm.device_timing import DeviceClock, DeviceTimeout


class FakeEvent:
    """A CUDA event whose device time is given (microseconds); elapsed_time answers in ms, as CUDA's; query
    says whether the device has passed it (always, unless told otherwise)."""

    def __init__(self, now, done=lambda: True):
        self.now, self.t, self.done = now, None, done

    def record(self):
        self.t = self.now()

    def query(self):
        return self.done()

    def elapsed_time(self, other):
        return (other.t - self.t) / 1000.0


class FakeWork:
    def __init__(self, ms=None):
        self.ms = ms

    def _get_duration(self):
        if self.ms is None:
            raise RuntimeError("timing is not enabled")
        return self.ms


def _clock(device_now):
    clock = DeviceClock(
        lambda: 1000.0, synchronize=lambda: None, event=lambda: FakeEvent(lambda: device_now[0])
    )
    clock.start_step()  # device t=0 is host t=1000 µs
    return clock


def test_device_spans_queue_per_stream_in_launch_order():
    """Spans start at their launch or when the stream's previous operation ends — in *launch* order, not
    the order the host waited in — and point-to-point to another peer set is a stream of its own."""
    device_now = [0.0]
    clock, spans = _clock(device_now), {}

    def launch(name, stream, at):
        device_now[0] = at
        return clock.launched(stream, [lambda s, e, n=name: spans.__setitem__(n, (s, e))])

    def wait(timed, work, at):
        device_now[0] = at
        clock.waited(timed, [work], deadline_us=float("inf"))

    a = launch("a", ("collective", "dp"), 100)
    b = launch("b", ("collective", "dp"), 120)
    c = launch("c", ("p2p", "pp", (1,)), 130)
    d = launch("d", ("p2p", "pp", (3,)), 135)
    e = launch("e", ("collective", "tp"), 500)
    wait(b, FakeWork(0.05), 400)  # waited before a: still runs after a on dp's stream
    wait(a, FakeWork(0.05), 400)
    wait(c, FakeWork(0.02), 400)
    wait(d, FakeWork(0.02), 400)
    wait(e, FakeWork(None), 650)  # untimed: ends at the event after its wait
    assert clock.end_step() == 5 and clock.pending == []
    assert spans["a"] == (1100, 1150)
    assert spans["b"] == (1150, 1200), (
        "one stream per group: b runs after a, whatever the wait order"
    )
    assert spans["c"] == (1130, 1150) and spans["d"] == (1135, 1155), (
        "p2p to other peers: separate streams"
    )
    assert spans["e"] == (1500, 1650)


def test_an_operation_not_yet_waited_for_is_written_at_a_later_step():
    device_now = [0.0]
    clock, spans = _clock(device_now), []
    timed = clock.launched(("collective", "dp"), [lambda s, e: spans.append((s, e))])
    assert clock.end_step() == 0 and len(clock.pending) == 1
    clock.waited(timed, [FakeWork(0.01)], float("inf"))
    assert clock.end_step() == 1 and spans == [(1000, 1010)]


def test_a_wait_blocks_until_the_device_is_done_and_times_out_at_the_deadline():
    """The host polls the event after the work: it returns once the device has passed it, and raises at
    the operation's deadline (a hung peer) instead of waiting for ever."""
    host = [0.0]
    looks = []

    def sleep(s):
        host[0] += s * 1e6

    def done():
        looks.append(host[0])
        return host[0] >= 300.0

    clock = DeviceClock(
        lambda: host[0],
        synchronize=lambda: None,
        event=lambda: FakeEvent(lambda: host[0], done),
        sleep=sleep,
    )
    clock.block_until(clock.mark(), deadline_us=1e6)
    assert 300.0 <= host[0] < 400.0 and len(looks) > 2
    never = DeviceClock(
        lambda: host[0],
        synchronize=lambda: None,
        sleep=sleep,
        event=lambda: FakeEvent(lambda: host[0], lambda: False),
    )
    with pytest.raises(DeviceTimeout, match="timed out"):
        never.block_until(never.mark(), deadline_us=host[0] + 50_000)


def _fake_cuda(comm, skew_us=0.0, done=lambda: True):
    """The communicator's device clock: events at the host's time + skew (a device that runs ahead)."""
    rec = comm.recorder
    comm.clock = DeviceClock(
        rec.now_us,
        synchronize=lambda: None,
        event=lambda: FakeEvent(lambda: rec.now_us() + skew_us, done),
    )
    return comm


def _cuda_shaped_rank(rank, world, out_dir):
    """Every kind of operation, device-timed, as a CUDA run records it; the trace is written for the test."""
    import torch

    # device events 5 µs before the host's
    comm = _fake_cuda(make_comm(rank, world, dp=2), skew_us=-5.0)
    comm.start_step(0)
    rec = comm.recorder
    with rec.span("ProfilerStep#0", "step", "compute", step=0):
        bucket = torch.ones(1000)
        handle = comm.all_reduce(bucket, "dp", async_op=True, label="bucket 0")
        with rec.span("backward", "backward", "compute", step=0):
            time.sleep(0.02)  # compute while the bucket is in flight
        handle.wait()
        # blocking: written once, when the step ends
        comm.all_reduce(torch.ones(1), "dp", label="loss")
        out = torch.empty(500)
        comm.reduce_scatter(out, torch.ones(1000), "dp", label="zero2 bucket 0")
        peer = 1 - rank
        comm.batch_isend_irecv(
            [
                ("send", torch.full((8,), float(rank)), peer, "activation"),
                ("recv", got := torch.empty(8), peer, "activation"),
            ],
            "dp",
        ).wait()
        assert torch.equal(got, torch.full((8,), float(peer)))
        assert [
            e for e in rec.events if e.get("cat") in ("collective", "p2p") and e["ph"] in "Xbe"
        ] == [], "nothing is written before the device says when it ran"
    comm.end_step()
    assert torch.equal(bucket, torch.full((1000,), 2.0)), "and the collectives themselves ran"
    with open(os.path.join(out_dir, f"trace_rank{rank}.json"), "w") as f:
        json.dump(rec.to_dict(), f)


@pytest.fixture(scope="module")
def cuda_shaped(tmp_path_factory):
    """Two ranks' traces shaped like a device-timed (CUDA) run: launch spans on the host, device spans
    from the device clock, a device that runs a few µs ahead of the host's view of it."""
    out = tmp_path_factory.mktemp("cuda_shaped")
    run_ranks(_cuda_shaped_rank, 2, str(out))
    return [json.load(open(out / f"trace_rank{r}.json")) for r in range(2)]


def test_a_cuda_shaped_trace_is_valid(cuda_shaped):
    """A device span that starts before its host launch span no longer breaks nesting: launch spans live
    on their own lane."""
    from workbench.trace.validate import validate_trace

    for trace in cuda_shaped:
        assert validate_trace(trace) == []
        launches = [e for e in trace["traceEvents"] if e.get("cat") == "launch"]
        assert launches and all(e["tid"] == 5 and "bytes" not in e["args"] for e in launches)


def test_each_operation_is_counted_once_on_cuda(cuda_shaped):
    """comm bytes from a CUDA-shaped trace: every operation once — the host's launch spans are not
    operations — so bytes per step equal what was moved."""
    from workbench.trace.spans import comm_intervals

    for trace in cuda_shaped:
        ops = comm_intervals(trace["traceEvents"])
        got = sorted((a["op"], a.get("label"), a["bytes"]) for a, _, _ in ops)
        assert got == sorted(
            [
                ("all_reduce", "bucket 0", 4000),
                ("all_reduce", "loss", 4),
                ("reduce_scatter", "zero2 bucket 0", 4000),
                ("send", "activation", 32),
                ("recv", "activation", 32),
            ]
        )
        waits = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "wait"]
        assert len(waits) == 4, (
            "every operation the host waited for: the bucket, the loss, the scatter, the batch"
        )


def _releasing_rank(rank, world):
    import torch

    comm = _fake_cuda(make_comm(rank, world, dp=2))
    comm.start_step(0)
    handle = comm.all_reduce(torch.ones(10), "dp", async_op=True)
    work = weakref.ref(handle.works[0])
    handle.wait()
    gc.collect()
    assert handle.works == [] and work() is None, (
        "the Work (and the tensors it holds) is let go at the wait"
    )
    assert len(comm.clock.pending) == 1, "only its events are kept until the step's end"
    comm.end_step()


def test_a_work_is_released_at_its_wait():
    run_ranks(_releasing_rank, 2)


def _hung_rank(rank, world):
    import torch

    from workbench.comm.traced import CommError

    comm = _fake_cuda(make_comm(rank, world, dp=2), done=lambda: False)  # the device never finishes
    comm.timeout_s = 0.2
    comm.start_step(0)
    handle = comm.all_reduce(torch.ones(4), "dp", async_op=True, label="bucket 3")
    with pytest.raises(CommError, match=r"rank \d: all_reduce bucket 3 on group dp .* timed out"):
        handle.wait()


def test_a_hung_device_operation_ends_in_a_comm_error():
    """NCCL's Work.wait() returns at once; the device never finishing must still end this rank's wait — at
    the operation's deadline, with a CommError naming it (the worker then writes its error file)."""
    run_ranks(_hung_rank, 2)
