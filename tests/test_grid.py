"""The rank grid: tp fastest, then dp, then pp (Megatron-LM's order)."""

from workbench.config.grid import RankGrid


def test_coordinates_put_tp_fastest_and_pp_slowest():
    g = RankGrid(dp=2, tp=2, pp=2)
    assert [tuple(g.coords(r)[a] for a in ("pp", "dp", "tp")) for r in range(8)] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]
    assert all(g.rank(**g.coords(r)) == r for r in range(8))


def test_context_parallel_sits_between_tp_and_dp():
    """rank = pp·(dp·cp·tp) + dp·(cp·tp) + cp·tp + tp: a cp group's ranks are tp apart, inside one dp
    replica; the gradient sync runs over dp × cp."""
    g = RankGrid(dp=2, tp=2, cp=2)
    assert g.world_size == 8
    assert g.all_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g.all_groups("cp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g.all_groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert all(g.rank(**g.coords(r)) == r for r in range(8))
    assert g.describe(6) == "rank 6 (dp 1, tp 0, pp 0, cp 1)"
    assert RankGrid(dp=2).describe(1) == "rank 1 (dp 1, tp 0, pp 0)"


def test_groups_along_each_axis():
    g = RankGrid(dp=2, tp=2, pp=2)
    assert g.all_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g.all_groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g.all_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_pure_data_parallel_grid():
    g = RankGrid(dp=4)
    assert g.all_groups("dp") == [[0, 1, 2, 3]]
    assert g.describe(3) == "rank 3 (dp 3, tp 0, pp 0)"
