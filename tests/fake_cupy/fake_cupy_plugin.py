"""pytest plugin for dry runs with the fake cupy: ``python -m pytest -p fake_cupy_plugin ...``.

``tests/mpirun.run_mpi`` builds the ranks' ``PYTHONPATH`` (the repository, then the caller's),
so the ranks it starts would not see this folder (on a GPU machine CuPy is installed, so they need nothing).  This
keeps the fake on their path; nothing else changes.
"""
import os

import tests.mpirun

FAKE_DIR = os.path.dirname(os.path.abspath(__file__))
_run_mpi = tests.mpirun.run_mpi


def run_mpi(nprocs, args, timeout=120, env=None, check=True):
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join([FAKE_DIR, env.get("PYTHONPATH", tests.mpirun.REPO)])
    return _run_mpi(nprocs, args, timeout=timeout, env=env, check=check)


tests.mpirun.run_mpi = run_mpi
