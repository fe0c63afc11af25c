"""Thread budgeting (minipar/process/threads.py): each rank gets cores // ranks-on-node BLAS
threads, as the BLAS itself reports them; a user's setting is kept.

The runs here start from a clean environment (no OMP/OPENBLAS/MKL_NUM_THREADS), which
is why they do not use tests/mpirun.py: run_mpi pins every rank to one thread.
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from minipar.process import threads
from tests.mpirun import REPO

SCRIPT = os.path.join("tests", "scripts", "threads_report.py")
CORES = threads.usable_cores()


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in threads.SET_VARS and k != threads.MARKER}
    env.update(PYTHONPATH=REPO, **extra)
    return env


def launch(n, *flags, env=None):
    """Rank reports (one dict per rank) of threads_report.py on ``n`` ranks
    (``n=0``: plain ``python``, no mpiexec).  Each rank writes its report to a file of its
    own: lines of several ranks on one stdout can interleave under load."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ([] if n == 0 else ["mpiexec", "-n", str(n)]) + [sys.executable, SCRIPT, *flags]
        proc = subprocess.run(cmd, cwd=REPO, env=dict(env or clean_env(), THREADS_REPORT_DIR=out),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reports = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out))]
    assert len(reports) == max(n, 1), proc.stdout
    return sorted(reports, key=lambda r: r["rank"])


def describe(ranks, threads, cores):
    """The header line for minipar's own choice: a one-thread BLAS, and minipar's pool
    of ``threads`` threads over it when there are several."""
    each = " each" if ranks > 1 else ""
    rs = f"{ranks} rank{'s' if ranks > 1 else ''} on this machine"
    if threads == 1:
        return f"{rs}, 1 BLAS thread{each} ({cores} cores)"
    return f"{rs}, {threads} threads{each} (minipar's pool over a 1-thread BLAS; {cores} cores)"


def test_two_ranks_share_the_cores():
    """2 ranks on a 2-core machine: 1 thread each (cores // 2 in general); the BLAS
    always runs one thread (several are minipar's pool over it)."""
    for r in launch(2):
        assert r["ranks_on_node"] == 2 and r["source"] == "MPI_LOCALNRANKS"
        assert r["threads"] == max(1, CORES // 2) and r["blas"] == [1]
        assert r["describe"] == describe(2, max(1, CORES // 2), CORES)


def test_one_rank_gets_every_core():
    for n in (0, 1):
        (r,) = launch(n)
        assert r["ranks_on_node"] == 1 and r["threads"] == CORES and r["blas"] == [1]
        assert r["describe"] == describe(1, CORES, CORES)


def test_a_users_setting_is_kept():
    for r in launch(2, env=clean_env(OMP_NUM_THREADS="2")):
        assert r["user_setting"] == "OMP_NUM_THREADS=2" and r["blas"] == [2]
        assert r["describe"].startswith("OMP_NUM_THREADS=2 set by you: kept")


def test_numpy_imported_first_is_limited_in_place():
    """NumPy's pool already started: threadpoolctl shrinks it."""
    for r in launch(2, "--numpy-first"):
        assert r["threads"] == max(1, CORES // 2) and r["blas"] == [1]


def test_mpi_split_when_the_launcher_says_nothing():
    """An unknown launcher: one process assumed at set-up, the MPI split corrects it."""
    for r in launch(2, "--hide-launcher", "--split"):
        assert r["source"] == "MPI: the ranks on this machine" and r["ranks_on_node"] == 2
        assert r["threads"] == max(1, CORES // 2) and r["blas"] == [1]


def test_importing_minipar_sets_nothing():
    """Thread variables and the allocator are set by setup_process, not by the import."""
    code = ("import os, minipar, minipar.process.allocator as a, minipar.process.threads as t\n"
            "assert a._applied is None and t._current is None, (a._applied, t._current)\n"
            "assert not set(t.SET_VARS + (t.MARKER,)) & set(os.environ), os.environ\n"
            "minipar.setup_process()\n"
            "assert t._current is not None and os.environ[t.MARKER]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_our_own_variables_are_not_the_users():
    """A child of a budgeted process inherits OMP_NUM_THREADS=2 with the marker: it
    budgets afresh instead of keeping it."""
    inherited = clean_env(OMP_NUM_THREADS=str(CORES), OPENBLAS_NUM_THREADS=str(CORES),
                          **{threads.MARKER: str(CORES)})
    for r in launch(2, env=inherited):
        assert r["user_setting"] is None and r["threads"] == max(1, CORES // 2) and r["blas"] == [1]


@pytest.mark.parametrize("env, expected", [
    ({"MPI_LOCALNRANKS": "4"}, (4, "MPI_LOCALNRANKS")),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, (3, "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "2", "SLURM_LOCALID": "0"},
     (3, "SLURM_STEP_TASKS_PER_NODE")),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(x2),3", "SLURM_NODEID": "1", "SLURM_LOCALID": "1"},
     (4, "SLURM_STEP_TASKS_PER_NODE")),
    ({"SLURM_NTASKS_PER_NODE": "8"}, None),              # an salloc shell, not a task
    ({}, None),
])
def test_ranks_on_node_from_launcher(env, expected):
    assert threads.ranks_on_node_from_launcher(env) == expected


def test_user_setting_and_description():
    assert threads.user_setting({"MKL_NUM_THREADS": "3"}) == "MKL_NUM_THREADS=3"
    assert threads.user_setting({"OMP_NUM_THREADS": "1", threads.MARKER: "1"}) is None
    assert threads.user_setting({"OMP_NUM_THREADS": ""}) is None
    one = threads.ThreadBudget(1, 8, 8, "no launcher: one process")
    assert threads.describe_threads(one) == describe(1, 8, 8)
    assert one.blas == 1 and one.splits_matmuls
    four = threads.ThreadBudget(4, 8, 2, "MPI_LOCALNRANKS")
    assert threads.describe_threads(four) == describe(4, 2, 8)
    eight = threads.ThreadBudget(8, 8, 1, "MPI_LOCALNRANKS")
    assert threads.describe_threads(eight) == "8 ranks on this machine, 1 BLAS thread each (8 cores)"
    assert eight.blas == 1 and not eight.splits_matmuls
    mine = threads.ThreadBudget(1, 8, 4, "no launcher: one process", "OMP_NUM_THREADS=4")
    assert mine.blas == 4 and not mine.splits_matmuls          # the user's BLAS threads itself
