"""Fail loud, never hang: check mode and abort_on_exception end the job quickly."""
import re

import pytest

from tests.mpirun import run_mpi

HANG_S = 120   # a guard, not a speed: these jobs end in seconds, and one that hangs fails here


@pytest.mark.parametrize("mode,detail", [("size", "count=101"), ("dtype", "dtype=float64"),
                                         ("op", "op=max")])
def test_check_mode_names_the_ranks_that_differ(mode, detail):
    proc = run_mpi(3, ["tests/scripts/comm_fail.py", mode], timeout=HANG_S, check=False,
                   env={"MINIPAR_COMM_CHECK": "1"})
    assert proc.returncode != 0
    assert "CollectiveMismatchError" in proc.stderr
    assert "ranks disagree" in proc.stderr and re.search(rf"ranks 1: .*{detail}", proc.stderr)
    assert "ranks 0,2:" in proc.stderr
    assert "unreachable" not in proc.stdout


def test_exception_on_one_rank_aborts_the_job():
    proc = run_mpi(4, ["tests/scripts/comm_fail.py", "abort"], timeout=HANG_S, check=False)
    assert proc.returncode != 0
    assert "rank 2: ValueError: boom on purpose" in proc.stderr
    assert "rank 2: Traceback" in proc.stderr


def test_unknown_names_are_refused():
    from minipar.comm.chunks import ufunc
    from minipar.comm.collectives import _algorithm
    with pytest.raises(ValueError, match="unknown reduction op"):
        ufunc("prod")
    with pytest.raises(ValueError, match="unknown all-reduce algorithm"):
        _algorithm("butterfly")
    assert _algorithm("rd") == "recursive_doubling"
    assert _algorithm("hierarchical:ring") == "hierarchical:ring"
