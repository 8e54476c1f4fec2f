"""Communication timed on the device (the CUDA path of comm/traced.py), with the arithmetic checked on a
CPU: a fake clock stands in for CUDA events, whose device time here is the host's. On a GPU,
tests/test_cuda.py runs the real thing."""

import time

from tests.distributed import make_comm, run_ranks
from workbench.comm.device_timing import DeviceClock, Timed


class FakeEvent:
    """A CUDA event whose device time is given (microseconds); elapsed_time answers in ms, as CUDA's."""

    def __init__(self, now):
        self.now, self.t = now, None

    def record(self):
        self.t = self.now()

    def elapsed_time(self, other):
        return (other.t - self.t) / 1000.0


class FakeWork:
    def __init__(self, ms=None):
        self.ms = ms

    def _get_duration(self):
        if self.ms is None:
            raise RuntimeError("timing is not enabled")
        return self.ms


def test_device_spans_queue_per_group_and_start_at_their_launch():
    device_now = [0.0]
    clock = DeviceClock(lambda: 1000.0, synchronize=lambda: None, event=lambda: FakeEvent(lambda: device_now[0]))
    clock.start_step()  # device t=0 is host t=1000 µs
    spans = {}

    def at(t):
        device_now[0] = t
        return clock.mark()

    def timed(name, group, launch, work, after_wait):
        return Timed(group, at(launch), work, at(after_wait), lambda s, e, n=name: spans.__setitem__(n, (s, e)))

    clock.pending += [timed("a", "dp", 100, FakeWork(0.05), 400),   # 50 µs on dp's stream
                      timed("b", "dp", 120, FakeWork(0.05), 400),   # queued behind a
                      timed("c", "tp", 130, FakeWork(0.01), 400),   # its own stream
                      timed("d", "tp", 500, FakeWork(None), 650)]   # untimed: ends at the wait's event
    assert clock.end_step() == 4 and clock.pending == []
    assert spans["a"] == (1100, 1150)
    assert spans["b"] == (1150, 1200), "one stream per group: b runs after a"
    assert spans["c"] == (1130, 1140)
    assert spans["d"] == (1500, 1650)


def _device_timed_ranks(rank, world):
    comm = make_comm(rank, world, dp=2)
    rec = comm.recorder
    comm.clock = DeviceClock(rec.now_us, synchronize=lambda: None, event=lambda: FakeEvent(rec.now_us))
    comm.start_step(3)
    import torch

    t = torch.ones(1000)
    handle = comm.all_reduce(t, "dp", async_op=True, label="bucket")
    time.sleep(0.05)  # "compute" while the collective is in flight
    handle.wait()
    comm.all_reduce(torch.ones(1), "dp", label="loss")
    records = [e for e in rec.events if e["name"] in ("all_reduce bucket", "all_reduce loss")]
    assert records == [], "nothing is written before the device says when it ran"
    comm.end_step()
    bucket = [e for e in rec.events if e["name"] == "all_reduce bucket"]
    assert [e["ph"] for e in bucket] == ["b", "e"], "an async span from the device's start to its end"
    assert bucket[1]["ts"] - bucket[0]["ts"] >= 50_000 * 0.9, "untimed work ends at the event after wait()"
    assert bucket[0]["args"]["busbw_GBps"] > 0 and bucket[0]["args"]["step"] == 3
    loss = [e for e in rec.events if e["name"] == "all_reduce loss"]
    assert [e["ph"] for e in loss] == ["X"], "a blocking collective is a complete span"
    assert torch.equal(t, torch.full((1000,), 2.0)), "and the collective itself ran"


def test_the_traced_layer_writes_device_times_when_the_step_ends():
    run_ranks(_device_timed_ranks, 2)
