"""Collectives against NumPy on 1..8 ranks (one mpiexec launch per rank count)."""
import pytest

from tests.mpirun import run_mpi

# check mode on; a wait longer than 60 s ends the launch with a report of who waits for whom
CHECK = {"MINIPAR_COMM_CHECK": "1", "MINIPAR_HANG_TIMEOUT": "60"}


# With more ranks than cores every message costs a context switch, so from 5 ranks up each
# launch runs every all-reduce algorithm on fewer sizes plus one of the other sections.
SECTIONS = {5: "all_reduce,others", 6: "all_reduce,hier", 7: "all_reduce,split",
            8: "all_reduce"}


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 6, 7, 8])
def test_collectives_match_numpy(nprocs):
    # sizes 0, 1, p-1, p+1, primes (7, 13, 31, 257, 1031); every algorithm, op and dtype;
    # out-of-place, non-contiguous, sub-communicators, hierarchical with 2 and 3 ranks/node;
    # a 2 MiB float32 buffer on 3 ranks
    args = ["tests/scripts/comm_correctness.py"]
    if nprocs == 3:
        args += ["--big", str(2 * (1 << 20) // 4 + 1)]  # 2 MiB: pipelined segments
    if nprocs in SECTIONS:
        args += ["--lite", "--sections", SECTIONS[nprocs]]
    proc = run_mpi(nprocs, args, timeout=150, env=CHECK)
    assert f"on {nprocs} ranks" in proc.stdout


@pytest.mark.parametrize("nprocs", [2, 3, 4, 5])
def test_traffic_counters_equal_textbook_volumes(nprocs):
    proc = run_mpi(nprocs, ["tests/scripts/comm_traffic.py"], timeout=90, env=CHECK)
    assert f"traffic OK on {nprocs} ranks" in proc.stdout


@pytest.mark.parametrize("nprocs", [1, 3])
def test_nonblocking_progress_and_isolation(nprocs):
    proc = run_mpi(nprocs, ["tests/scripts/comm_async.py"], timeout=90, env=CHECK)
    assert f"async OK on {nprocs} ranks" in proc.stdout
