"""Strided and oddly shaped buffers, bit-identical replicas, and no progress-thread deadlock."""
import pytest

from tests.mpirun import run_mpi

# check mode on, as in every comm test; fixed cost-model constants skip the calibration
# each fresh communicator would otherwise run (the overlap section makes 20 of them)
ENV = {"MINIPAR_COMM_CHECK": "1", "MINIPAR_HANG_TIMEOUT": "60", "MINIPAR_COMM_ALPHA": "5e-6",
       "MINIPAR_COMM_BETA": "2e-10", "MINIPAR_COMM_GAMMA": "2e-10"}


@pytest.mark.parametrize("nprocs,sections", [(1, "strided,bits"), (3, "strided,bits,overlap"),
                                             (4, "bits,overlap")])
def test_strided_outputs_identical_replicas_and_overlapping_first_use(nprocs, sections):
    # 1 rank: the strided-out bugs showed there too; 3 ranks: recursive doubling folds a
    # rank in, nodes of 3 ranks; 4: a power of two, nodes of 2 (two nodes).  The strided
    # cases do not depend on the rank count beyond 1 vs several, so 4 ranks skip them.
    proc = run_mpi(nprocs, ["tests/scripts/comm_edge.py", "--sections", sections], timeout=120,
                   env=ENV)
    assert "edge OK" in proc.stdout and f"on {nprocs} ranks" in proc.stdout
