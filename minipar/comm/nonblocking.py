"""Non-blocking collectives: a progress thread runs them while the caller computes.

    handle = all_reduce_async(comm, flat_grad_buffer, op="sum", algorithm="ring")
    ...                                     # backward keeps computing meanwhile
    handle.wait()                           # -> the reduced buffer

Each communicator gets one progress thread with a FIFO queue (the role of a CUDA
stream in NCCL).  Ranks must start their non-blocking collectives on a communicator
in the same order — exactly the rule for blocking ones — and the FIFO keeps that order.
The thread works on a private duplicate of the communicator (its own MPI context), so
its messages never mix with those of blocking collectives or user p2p on the main thread.

Why this really overlaps: mpi4py releases the GIL inside blocking MPI calls and NumPy
releases it inside large ufuncs, so the thread's transfers and reductions proceed while
the main thread computes (with another core they run truly in parallel).  It needs
MPI initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default request; MPICH and Open
MPI grant it).  If ``MPI.Query_thread()`` reports less, the operation runs at submission
and the handle comes back already complete — correct, but without overlap.

A handle is ``wait(timeout=None)`` (returns the result, re-raises the thread's error)
and ``test()`` (True once complete; never blocks and does not need to be called for
progress).  CuPy: the thread uses the default device; call from a process that set it.
"""
from __future__ import annotations

import queue
import threading
import time

from mpi4py import MPI

from minipar.comm import collectives
from minipar.comm.hierarchical import node_layout


class Handle:
    """The future result of a non-blocking collective."""

    __slots__ = ("_done", "_result", "_error", "name", "started_at", "finished_at")

    def __init__(self, name):
        self.name = name
        self.started_at = self.finished_at = None   # perf_counter() times, for timelines
        self._done = threading.Event()
        self._result = None
        self._error = None

    def _finish(self, result=None, error=None):
        self.finished_at = time.perf_counter()
        self._result, self._error = result, error
        self._done.set()

    def test(self) -> bool:
        """True once the collective has completed (on this rank)."""
        return self._done.is_set()

    def wait(self, timeout=None):
        """Block until complete; returns the collective's result."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.name} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result


class _ProgressThread:
    def __init__(self, comm):
        self.comm = comm
        self.queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"minipar-comm-{id(comm):x}",
                                       daemon=True)
        self.thread.start()

    def _run(self):
        while True:
            self._run_one(*self.queue.get())

    def _run_one(self, handle, fn, args, kwargs):
        """One collective.  Its arguments are this call's locals, so they are let go as
        soon as it returns: a loop variable would keep the last buffer alive until the
        next collective arrives."""
        handle.started_at = time.perf_counter()
        try:
            handle._finish(fn(self.comm, *args, **kwargs))
        except BaseException as err:  # surfaces in handle.wait() on this rank
            handle._finish(error=err)


def threads_available() -> bool:
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def _start(comm):
    """First non-blocking call on ``comm``: set up, on this (main) thread, everything the
    progress thread could otherwise build itself — the private context, the cost model
    and the node layout — then start the thread.  Each of these is collective: building
    them here, in submission order, keeps every rank's order the same, and the progress
    thread never makes a collective setup call of its own (a pickled mpi4py call there
    would hold the GIL while waiting and deadlock the main thread's collectives)."""
    coll = comm.context("coll")
    ctx = comm.context("async")  # collective Dup on first use: same order on all ranks
    if coll.size > 1:
        ctx.cache["cost"] = collectives._params(coll)  # calibrated once, shared
        node_layout(ctx)
    engine = ctx.cache["engine"] = _ProgressThread(ctx)
    return engine


def submit(comm, fn, *args, **kwargs) -> Handle:
    """Run ``fn(async_context, *args, **kwargs)`` on ``comm``'s progress thread."""
    handle = Handle(getattr(fn, "__name__", "collective"))
    if not threads_available():
        try:
            handle._finish(fn(comm, *args, **kwargs))
        except Exception as err:
            handle._finish(error=err)
        return handle
    engine = comm.context("async").cache.get("engine")
    if engine is None:
        engine = _start(comm)
    engine.queue.put((handle, fn, args, kwargs))
    return handle


def all_reduce_async(comm, array, op="sum", algorithm="auto", out=None) -> Handle:
    """Non-blocking :func:`~minipar.comm.collectives.all_reduce`."""
    return submit(comm, collectives.all_reduce, array, op=op, algorithm=algorithm, out=out)


def reduce_scatter_async(comm, array, op="sum", out=None, inplace=False) -> Handle:
    return submit(comm, collectives.reduce_scatter, array, op=op, out=out, inplace=inplace)


def all_gather_async(comm, shard, sizes=None, out=None) -> Handle:
    return submit(comm, collectives.all_gather, shard, sizes=sizes, out=out)


def broadcast_async(comm, array, root=0, algorithm="auto") -> Handle:
    return submit(comm, collectives.broadcast, array, root=root, algorithm=algorithm)


def reduce_async(comm, array, root=0, op="sum", out=None, algorithm="auto") -> Handle:
    return submit(comm, collectives.reduce, array, root=root, op=op, out=out, algorithm=algorithm)


def all_to_all_async(comm, send, counts, out=None, algorithm="auto") -> Handle:
    """Non-blocking :func:`~minipar.comm.collectives.all_to_all`; ``wait()`` returns
    ``(received, recv_counts)``."""
    return submit(comm, collectives.all_to_all, send, counts, out=out, algorithm=algorithm)
