"""Process set-up: the two process-wide settings a minipar rank makes for itself
(``threads.py``: how many threads; ``allocator.py``: freed blocks kept), and where to
find the mpiexec that starts the ranks (``mpiexec_path``).

    setup_process()          first thing, before NumPy is imported where possible
    setup_process(comm)      again once MPI is up (collective over ``comm``)

1. **Thread budget** (``threads.budget_threads``): this rank's share of the node's
   cores, ``cores // ranks on this node``, for the BLAS and minipar's own row threads.
   With ``comm``, MPI counts the ranks that share the node (a launcher may not say).
2. **Freed blocks kept for reuse** (``allocator.keep_freed_blocks``): glibc keeps the
   activation buffers a step frees, so the next step does not fault their pages in again.

Both change the whole process, so importing minipar makes neither: a notebook, a test
runner or a script that sized its own thread pools keeps what it had until it asks.
The entry points ask: ``python -m minipar`` before anything imports NumPy, ``train``'s
``setup`` with the MPI communicator, ``calibrate`` before it measures.  Calling it again
is cheap; what a user set (``OMP_NUM_THREADS``, ``MALLOC_MMAP_THRESHOLD_``, ...) is kept.

Why "before NumPy": a BLAS reads the thread variables when it loads and starts that
many threads.  Called later, the budget still holds — the running pools are resized in
place (``threadpoolctl``) — but the BLAS has already started a thread per core, which
then sleep.  A process that never calls it gets its thread budget where minipar first
needs it, at the first matmul or row-split op (``threads.current_budget``), and the
system allocator's defaults.
"""
from __future__ import annotations

import os
import shutil
import sys

from minipar.process.allocator import keep_freed_blocks
from minipar.process.threads import ThreadBudget, budget_threads


def setup_process(comm=None) -> ThreadBudget:
    """Budget this rank's threads (with ``comm``: COLLECTIVE, MPI's count of the ranks on
    this node) and keep freed blocks for reuse; returns the thread budget."""
    budget = budget_threads(comm)
    keep_freed_blocks()
    return budget


def mpiexec_path():
    """The mpiexec that goes with this Python, or None: the one beside ``sys.executable``
    (a virtual environment's ``bin/``, where the ``mpich`` wheel installs it), else the
    first on PATH.  A Jupyter kernel or a shell from another environment may have no venv
    ``bin/`` on its PATH, and an mpiexec of another MPI would start N separate one-rank
    jobs instead of one N-rank job."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpiexec")
