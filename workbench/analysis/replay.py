"""Replay an execution graph (analysis/execution_graph.py): run every rank's program against the others,
with each busy stretch, each operation's cost and each block's residual as the graph holds them.

    graph = execution_graph.build(load_traces("traces/dp2"))
    result = replay(graph)
    result.step_us        # the replayed step, mean over ranks and steps (the first step left out)
    result.measured_us    # the measured one, over the same ranks and steps
    result.error          # (replayed − measured) / measured

A discrete-event replay: a rank runs its program until it blocks on an operation that is not done; an
operation is done once every member has issued it and the one before it on its queue is done, plus its
cost. A rank's block ends at max(its start, the operations' completion) + its residual. Unedited, the
replay reproduces the run (the graph's own consistency check: `check` holds it to 5 % of the step and
each lane's time to 10 % of it); edited (analysis/what_if.py), it predicts another configuration.
No torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from workbench.analysis.execution_graph import Completions, Graph


@dataclass(kw_only=True)
class Replayed:
    """What the replay gives, beside what was measured (µs)."""

    step_us: float
    measured_us: float
    per_rank_us: dict[int, float]  # each rank's replayed step, mean over the steps compared
    measured_per_rank_us: dict[int, float]
    # each rank's replayed compute / blocked / host per step (mean)
    lanes_us: dict[int, dict[str, float]]
    measured_lanes_us: dict[int, dict[str, float]]
    steps: list[int] = field(default_factory=list)

    @property
    def error(self) -> float:
        return (self.step_us - self.measured_us) / self.measured_us

    def lane_errors(self) -> dict[int, dict[str, float]]:
        """Per rank and lane: (replayed − measured) time as a share of the measured step."""
        return {
            r: {
                k: (self.lanes_us[r][k] - self.measured_lanes_us[r][k])
                / self.measured_per_rank_us[r]
                for k in self.lanes_us[r]
            }
            for r in self.lanes_us
        }

    def check(self, step_tolerance: float = 0.05, lane_tolerance: float = 0.10) -> None:
        """AssertionError unless the replay is within `step_tolerance` of the measured step and every rank's
        every lane within `lane_tolerance` of its step."""
        assert abs(self.error) <= step_tolerance, (
            f"replayed step {self.step_us:.0f} µs vs measured {self.measured_us:.0f} µs: {self.error:+.1%}"
        )
        for r, lanes in self.lane_errors().items():
            for lane, e in lanes.items():
                assert abs(e) <= lane_tolerance, (
                    f"rank {r}'s {lane} time off by {e:+.1%} of its step"
                )


class _Stuck(RuntimeError):
    pass


Marks = dict[int, dict[tuple[str, int], float]]
Lanes = dict[int, dict[int, dict[str, float]]]


def run(graph: Graph) -> tuple[Marks, Lanes]:
    """Replay: each rank's time at each mark, {rank: {('start' | 'end', step): µs}}, and its compute, blocked
    and host time per step; each block's replayed span is left in its meta."""
    clock = dict(graph.start_us)
    pc = {r: 0 for r in graph.programs}
    ops = Completions(graph.ops, graph.slots)
    marks: Marks = {r: {} for r in graph.programs}
    lanes: Lanes = {r: {} for r in graph.programs}
    progress = True
    while progress:
        progress = False
        for r, program in graph.programs.items():
            while pc[r] < len(program):
                it = program[pc[r]]
                share = lanes[r].setdefault(it.step, {"compute": 0.0, "blocked": 0.0, "host": 0.0})
                if it.kind == "busy":
                    clock[r] += it.us
                    share["compute" if it.tag == "compute" else "host"] += it.us
                elif it.kind == "issue":
                    clock[r] += it.us  # an emulated send's hold, before it is posted
                    share["host"] += it.us
                    ops.issue(it.keys[0], r, clock[r])
                elif it.kind == "block":
                    waiting = [(k, r) for k in it.keys if k in graph.ops]
                    if any(w not in ops.done for w in waiting):
                        break
                    end = max([clock[r]] + [ops.done[w] for w in waiting]) + it.us
                    share["blocked"] += end - clock[r]
                    it.meta["replayed"] = (clock[r], end)
                    clock[r] = end
                else:
                    marks[r][(it.tag, it.step)] = clock[r]
                pc[r] += 1
                progress = True
    stuck = [r for r in graph.programs if pc[r] < len(graph.programs[r])]
    if stuck:
        r = stuck[0]
        it = graph.programs[r][pc[r]]
        missing = [k for k in it.keys if (k, r) not in ops.done]
        raise _Stuck(
            f"the replay cannot go on: rank {r} waits for {missing[:2]}, which some member never issues "
            f"(a dependency the graph lacks)"
        )
    return marks, lanes


def replay(graph: Graph, skip_first: bool = True) -> Replayed:
    """Replay the graph and set its steps (after the first, unless `skip_first` is False) beside the
    measured ones."""
    marks, lanes = run(graph)
    steps = sorted(next(iter(graph.measured_us.values())))
    compared = steps[1:] if skip_first and len(steps) > 1 else steps
    per_rank = {
        r: statistics.mean(m[("end", s)] - m[("start", s)] for s in compared)
        for r, m in marks.items()
    }
    measured = {
        r: statistics.mean(graph.measured_us[r][s] for s in compared) for r in graph.programs
    }

    def mean_lanes(source: dict[int, dict[int, dict[str, float]]], r: int) -> dict[str, float]:
        return {
            k: statistics.mean(source[r].get(s, {}).get(k, 0.0) for s in compared)
            for k in ("compute", "blocked", "host")
        }

    return Replayed(
        step_us=statistics.mean(per_rank.values()),
        measured_us=statistics.mean(measured.values()),
        per_rank_us=per_rank,
        measured_per_rank_us=measured,
        lanes_us={r: mean_lanes(lanes, r) for r in graph.programs},
        measured_lanes_us={r: mean_lanes(graph.lanes_us, r) for r in graph.programs},
        steps=compared,
    )
