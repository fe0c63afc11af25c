"""The process grid: rank arithmetic, validation, and its sub-communicators — every
rank's groups against an enumeration of the documented numbering (tests/grid_groups.py),
context parallelism included: in one process through MPI_Comm_split's rule, and with
real communicators under mpiexec."""
import pytest

from minipar.parallel.grid import ProcessGrid, check_grid_sizes, coordinates, rank_of
from tests.grid_groups import KINDS, expected_groups
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


class SplitRecorder:
    """One rank's world communicator, without MPI: ``split`` records its (colour, key)
    and returns a handle to that call."""

    def __init__(self, rank, size):
        self.rank, self.size, self.calls = rank, size, []

    def split(self, color, key=0):
        self.calls.append((color, key))
        return len(self.calls) - 1, color


def groups_by_split(dp, cp, tp, pp):
    """Build a ProcessGrid for every rank of dp·cp·tp·pp and form each sub-communicator
    as MPI_Comm_split does: the ranks of one call that gave the same colour, ordered by
    key, then by world rank.  [(coordinates, {kind: [world ranks in sub-rank order]})]."""
    size = dp * cp * tp * pp
    worlds = [SplitRecorder(r, size) for r in range(size)]
    grids = [ProcessGrid(w, dp=dp, tp=tp, pp=pp, cp=cp) for w in worlds]
    assert len({len(w.calls) for w in worlds}) == 1        # a collective: every rank calls it
    members = {}
    for w in worlds:
        for call, (color, key) in enumerate(w.calls):
            members.setdefault((call, color), []).append((key, w.rank))
    out = []
    for g in grids:
        c = g.coords
        out.append(((c.dp, c.cp, c.tp, c.pp),
                    {kind: [r for _, r in sorted(members[getattr(g, f"{kind}_comm")])]
                     for kind in KINDS}))
    return out


@pytest.mark.parametrize("dp,cp,tp,pp", [(1, 2, 1, 1), (2, 2, 1, 1), (1, 2, 2, 1), (1, 4, 1, 2),
                                         (3, 2, 1, 2), (2, 2, 2, 2), (2, 3, 2, 1), (2, 1, 3, 2)])
def test_every_ranks_groups_with_context_parallelism(dp, cp, tp, pp):
    want = expected_groups(dp, cp, tp, pp)
    for rank, got in enumerate(groups_by_split(dp, cp, tp, pp)):
        assert got == want[rank], (rank, got, want[rank])


def test_the_enumeration_itself():
    """dp 2 × cp 2 × tp 2, written out: rank 5 is (dp 1, cp 0, tp 1)."""
    coords, groups = expected_groups(2, 2, 2, 1)[5]
    assert coords == (1, 0, 1, 0)
    assert groups == {"tp": [4, 5], "cp": [5, 7], "dp": [1, 5], "dp_cp": [1, 3, 5, 7], "pp": [5]}


@pytest.mark.parametrize("n,layout", [(8, (2, 2, 2)), (6, (3, 2, 1)), (6, (1, 3, 2)), (3, (3, 1, 1)),
                                      (4, (2, 1, 1, 2))])
def test_sub_communicators(n, layout):
    out = run_mpi(n, ["tests/scripts/grid_check.py", *layout], timeout=60)
    assert out.stdout.count(" ok ") == n
