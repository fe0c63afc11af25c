"""pytest plugin for dry runs with the fake cupy: ``python -m pytest -p fake_cupy_plugin ...``.

``tests/mpirun.run_mpi`` gives the ranks a ``PYTHONPATH`` of its own (the repository, then
this process's); where the fake reached pytest some other way than that variable, the ranks
it starts would import the real CuPy, or none (on a GPU machine CuPy is installed, so they
need nothing).  This puts the fake first on their path; nothing else changes.
"""
import os

import tests.mpirun

FAKE_DIR = os.path.dirname(os.path.abspath(__file__))
_run_mpi = tests.mpirun.run_mpi


def run_mpi(nprocs, args, timeout=120, env=None, check=True):
    env = dict(env or {})
    rest = env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (FAKE_DIR, tests.mpirun.REPO, rest) if p)
    return _run_mpi(nprocs, args, timeout=timeout, env=env, check=check)


tests.mpirun.run_mpi = run_mpi
