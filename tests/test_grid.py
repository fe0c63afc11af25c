"""The process grid: rank arithmetic, validation, and real sub-communicators."""
import pytest

from minipar.parallel.grid import check_grid_sizes, coordinates, rank_of
from tests.mpirun import run_mpi


def test_rank_formula_tp_fastest_then_dp_then_pp():
    dp, tp, pp = 2, 3, 2
    seen = set()
    for rank in range(12):
        c = coordinates(rank, dp, tp, pp)
        assert rank_of(c, dp, tp, pp) == rank
        seen.add((c.dp, c.tp, c.pp))
    assert len(seen) == 12
    assert coordinates(1, dp, tp, pp).tp == 1 and coordinates(3, dp, tp, pp).dp == 1
    assert coordinates(6, dp, tp, pp).pp == 1


def test_bad_sizes_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="mpiexec -n 8"):
        check_grid_sizes(6, 2, 2, 2)
    with pytest.raises(ValueError, match="positive"):
        check_grid_sizes(4, 0, 2, 2)


@pytest.mark.parametrize("n,layout", [(8, (2, 2, 2)), (6, (3, 2, 1)), (6, (1, 3, 2)), (3, (3, 1, 1))])
def test_sub_communicators(n, layout):
    out = run_mpi(n, ["tests/scripts/grid_check.py", *layout], timeout=60)
    assert out.stdout.count(" ok ") == n
