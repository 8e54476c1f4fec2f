"""DualPipe and DualPipeV (DeepSeek-V3, 2024; workbench/schedules/dualpipe.py): bidirectional
pipelines as data, held to torch's `ScheduleDualPipeV`, to torch's runtime, and to one process.

Our DualPipeV CSV training in torch's `_PipelineScheduleRuntime` (CPU, gloo) as one process trains
is tests/test_zero_bubble.py's `test_torchs_runtime_runs_our_zbh1_and_dualpipev_and_we_run_torchs_...`:
one torchrun launch runs both CSVs against one single-process reference, so the case costs seconds.
"""

import types

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _PipelineScheduleRuntime

from workbench.schedules.actions import compute_cells
from workbench.schedules.build import build_schedule
from workbench.schedules.torch_csv import read_csv, write_csv

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
