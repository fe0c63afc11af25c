"""Fail loud, never hang: an uncaught exception on any rank aborts the whole job.

Without this, a rank that dies leaves its peers blocked forever in a receive that will
never be matched.  ``abort_on_exception()`` installs a ``sys.excepthook`` (and a
``threading.excepthook``) that prints the traceback with every line prefixed
``rank R: `` and then calls ``MPI.COMM_WORLD.Abort(1)``, which makes the launcher kill
every rank and exit non-zero.  Call it once at the top of an mpiexec entry point.
"""
from __future__ import annotations

import sys
import threading
import traceback


def _report_and_abort(exc_type, exc, tb):
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.Get_rank()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    sys.stderr.write("".join(f"rank {rank}: {line}\n" for line in text.rstrip().splitlines()))
    sys.stderr.flush()
    sys.stdout.flush()
    MPI.COMM_WORLD.Abort(1)


def abort_on_exception() -> None:
    """Make any uncaught exception (main thread or other threads) abort all ranks."""
    sys.excepthook = _report_and_abort
    threading.excepthook = lambda args: _report_and_abort(args.exc_type, args.exc_value,
                                                          args.exc_traceback)
