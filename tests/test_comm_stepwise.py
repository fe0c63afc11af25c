"""The stepped ring all-reduce DDP advances from its gradient hooks (comm/stepwise.py):
bit-identical to the blocking ring, right for every size, on 1..8 ranks, odd included,
with several in flight and advanced in different orders on different ranks."""
import pytest

from tests.mpirun import run_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3, 5, 8])
def test_stepped_all_reduce(nprocs):
    proc = run_mpi(nprocs, ["tests/scripts/comm_stepwise.py"], timeout=180)
    assert proc.stdout.count("stepwise ok") == nprocs
