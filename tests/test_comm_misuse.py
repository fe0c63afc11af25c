"""Every misuse of a collective is answered by a clear error on every rank; a stuck wait
ends the job through the hang-timeout watchdog."""
import json
import re

import pytest

from tests.mpirun import run_mpi

CHECK = {"MINIPAR_COMM_CHECK": "1", "MINIPAR_HANG_TIMEOUT": "60"}  # a hang reports who waits
HANG_S = 180   # a guard, not a speed: past the watchdog's 60 s, so a hang fails with its report
ARG, MISMATCH = "CollectiveArgumentError", "CollectiveMismatchError"

# case -> (error type on every rank, text the message must contain)
EXPECTED = {
    "all_reduce out shape, one rank": (ARG, "rank 1: all_reduce: out has shape (5,)"),
    "all_reduce out dtype": (ARG, "out has shape (4,) and dtype float64; it must match"),
    "all_reduce read-only": (ARG, "array is read-only"),
    "all_reduce str": (ARG, "which 'sum' cannot reduce"),
    "all_reduce object": (ARG, "dtype object"),
    "all_reduce bool sum": (ARG, "cast to an integer type to count"),
    "all_reduce list": (ARG, "rank 1: all_reduce: array must be an array, not list"),
    "all_reduce unknown op, one rank": (ARG, "rank 1: all_reduce: unknown reduction op 'prod'"),
    "all_reduce unknown algorithm": (ARG, "unknown all-reduce algorithm 'butterfly'"),
    "all_reduce algorithm mismatch": (MISMATCH, "ranks 1: count=3 dtype=float32 op=sum "
                                                "algorithm=tree"),
    "all_reduce count mismatch": (MISMATCH, "ranks 1: count=7"),
    "all_reduce dtype mismatch": (MISMATCH, "ranks 1: count=6 dtype=float64"),
    "async all_reduce out shape, one rank": (ARG, "rank 1: all_reduce: out has shape (3,)"),
    "reduce out on root only": (ARG, "rank 1: reduce: out has shape (2,)"),
    "reduce root = size": (ARG, "root=3 is not a rank of this 3-rank communicator (valid: 0..2)"),
    "reduce root = -1": (ARG, "root=-1 is not a rank"),
    "reduce root not an int": (ARG, "root must be an integer rank, not 0.5"),
    "reduce root mismatch": (MISMATCH, "ranks 1: count=4 dtype=float32 root=1"),
    "broadcast root = size": (ARG, "broadcast: root=3 is not a rank"),
    "broadcast root = -1": (ARG, "broadcast: root=-1 is not a rank"),
    "broadcast object": (ARG, "pointers to Python objects"),
    "broadcast unknown algorithm": (ARG, "unknown broadcast algorithm 'ring'"),
    "reduce_scatter small shard into big out": (ARG, "out has 7 elements (shape (7,)); the result has 1"),
    "reduce_scatter out dtype (int16 from float)": (ARG, "out has dtype int16; the result is float32"),
    "async reduce_scatter out size, one rank": (ARG, "rank 1: reduce_scatter: out has 3 elements"),
    "all_gather out too big (sizes given)": (ARG, "out has 9 elements (shape (9,)); the result has 6"),
    "all_gather out too big, one rank (sizes exchanged)": (
        ARG, "rank 1: all_gather: out has 7 elements; the result has 6"),
    "all_gather out too big, every rank (sizes exchanged)": (ARG, "rank 2: all_gather: out has 7 elements"),
    "all_gather out dtype": (ARG, "out has dtype float64; the result is float32"),
    "all_gather dtype mismatch": (MISMATCH, "ranks 1: dtype=float64"),
    "all_gather sizes on one rank only": (MISMATCH, "ranks 1: dtype=float32 sizes=(2, 2, 2)"),
    "all_gather sizes wrong length": (ARG, "sizes has 4 entries for a 3-rank communicator"),
    "all_gather shard is not sizes[rank]": (
        ARG, "rank 1: all_gather: the shard has 3 elements but sizes[1] = 2"),
    "barrier vs all_reduce": (MISMATCH, "ranks 1: called barrier"),  # and the same words everywhere
}


@pytest.fixture(scope="module")
def misuse():
    proc = run_mpi(3, ["tests/scripts/comm_misuse.py"], timeout=HANG_S, env=CHECK)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_table_covers_every_case(misuse):
    assert sorted(misuse) == sorted(EXPECTED)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_misuse_is_a_clear_error_on_every_rank(misuse, case):
    kind, text = EXPECTED[case]
    for mode, per_rank in misuse[case].items():  # "check", and "nocheck" where it is safe
        assert len(per_rank) == 3
        for rank, (got, message) in enumerate(per_rank):
            assert got == kind, f"{mode}, rank {rank}: {got}: {message}"
            assert text in message, f"{mode}, rank {rank}: {message!r} lacks {text!r}"
        if mode == "check" and (kind == ARG or case == "barrier vs all_reduce"):
            assert len({m for _, m in per_rank}) == 1, per_rank  # the same words everywhere


@pytest.mark.parametrize("mode,what", [("blocking", r"all_reduce \(ring\)"),
                                       ("async", r"all_reduce \(check mode: agreeing on arguments\)")])
def test_watchdog_names_the_stuck_wait_and_ends_the_job(mode, what):
    """Rank 0 sleeps 60 s inside its turn and never joins; only rank 1's watchdog (timeout
    1 s) can end the job: without it the job hangs, and HANG_S fails it."""
    proc = run_mpi(2, ["tests/scripts/comm_watchdog.py", mode], timeout=HANG_S, check=False,
                   env=CHECK)
    assert proc.returncode != 0
    assert "rank 1: waits under the timeout passed" in proc.stdout
    report = re.search(rf"rank 1: {what} waited (\d+\.\d) s for rank 0; ending the job "
                       r"\(hang timeout 1 s\)", proc.stderr)
    assert report, proc.stderr[-2000:]
    assert float(report.group(1)) >= 1.0                 # never before its timeout
    assert "unreachable" not in proc.stdout
