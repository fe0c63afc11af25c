"""Launch ``mpiexec -n N`` as a subprocess with a timeout, for multi-rank tests.

A deadlock shows up as a ``subprocess.TimeoutExpired`` failure, never a hung suite.
"""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_mpi(nprocs, args, timeout=120, env=None, check=True):
    """Run ``mpiexec -n nprocs python ARGS...`` from the repository root.

    ``args`` are the arguments after ``python`` (e.g. ``["-m", "minipar", "train"]``
    or ``["tests/scripts/x.py"]``); collectives run in check mode (``MINIPAR_COMM_CHECK=1``)
    unless ``env`` says otherwise. Returns the CompletedProcess; with ``check``
    a non-zero exit fails with the output of every rank.
    """
    # check mode on by default: every collective's arguments agreed by all ranks before data
    # moves, so a test that misuses one fails on every rank instead of hanging
    # the repository first, then the caller's path (a GPU machine may bring mpi4py from there)
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                    MKL_NUM_THREADS="1", PYTHONPATH=path, MINIPAR_COMM_CHECK="1")
    full_env.update(env or {})
    cmd = ["mpiexec", "-n", str(nprocs), sys.executable] + [str(a) for a in args]
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-4000:]}")
    return proc
