"""The p2p transport every collective in minipar is written on.

A :class:`Transport` wraps an mpi4py communicator and offers a deliberately tiny
interface — ``send / recv / sendrecv / isend / irecv / wait / waitall`` — on
*contiguous arrays*.  Messages always travel as raw bytes (``[array, MPI.BYTE]``): the
collectives do their own reductions, so MPI never needs to know the dtype, float16 and
bfloat16 work like any other type, and nothing is ever pickled on the hot path.

Counters (``bytes_sent``, ``bytes_recv``, ``msgs_sent``, ``msgs_recv``) record every
data message (not check mode's or setup's tiny metadata exchanges), which makes textbook
volumes checkable: a ring all-reduce of S bytes over n ranks must show
``bytes_sent == 2(n-1)/n·S`` (up to uneven chunks) on every rank.

Device arrays (CuPy) travel by the communicator's *transport* (``transport=`` or
``MINIPAR_TRANSPORT``: auto, pageable, staging, cuda-aware — ``device_paths.py``,
``staging.py`` — or nccl, ``nccl_path.py``): by default to MPI directly where MPI is
CUDA-aware, else through pinned host buffers in chunks.  Each path is a ``path`` object
with the five calls below; host arrays skip it (``_plain``) unless it cuts messages.

Collectives run on a private duplicate of the user's communicator (a *context*, as MPI
does internally), so user point-to-point messages can never match a collective's, and
non-blocking collectives get yet another context driven by a progress thread.

``check`` mode (``check=True`` or ``MINIPAR_COMM_CHECK=1``) makes every collective first
agree on a small fixed-size descriptor of its arguments (see ``agree.py``) and raise
:class:`CollectiveMismatchError` naming the ranks that disagree, instead of hanging.
``hang_timeout`` (seconds, or ``set_hang_timeout``) lets a watchdog end the job when a
wait on a peer lasts too long (see ``watchdog.py``).

This is the bottom layer of ``comm``: everything above is written on these calls.  What
users hold is ``communicator.Communicator``, this class plus ``barrier()`` — a collective,
so it is added above the collectives, and the transport imports none of them.  Splits and
contexts have the class of the communicator they come from.
"""
from __future__ import annotations

import os

import numpy
from mpi4py import MPI

from minipar.backend import backend_name, xp
from minipar.comm import watchdog
from minipar.comm.counters import Counters
from minipar.comm.device_paths import COLL_TAG  # noqa: F401  (the collectives import it from here)
from minipar.comm.device_paths import CudaAwarePath, PageablePath, resolve
from minipar.comm.nccl_path import NcclPath
from minipar.comm.staging import staging_path

_HOST = numpy.ndarray
_BYTE = MPI.BYTE


class CollectiveMismatchError(RuntimeError):
    """Ranks called a collective with different arguments (sizes, dtypes, op...)."""


class CollectiveArgumentError(ValueError):
    """A collective's arguments are wrong on some rank (dtype, ``out``, root, ...); in
    check mode every rank raises it, naming the rank and what is wrong there."""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() not in ("0", "", "false", "no", "off")


class Request:
    """A pending isend/irecv: one MPI request, or one per chunk (staging).  ``wait()``
    completes it (and copies a staged receive to the device); ``test()`` says whether it
    has completed, without blocking."""

    __slots__ = ("mpi", "finish", "comm", "peer", "kind")

    def __init__(self, mpi_requests, finish, comm, peer, kind):
        self.mpi = mpi_requests
        self.finish = finish  # host->device copy for staged receives
        self.comm, self.peer, self.kind = comm, peer, kind  # for the watchdog's report

    def wait(self):
        self.comm._watch(self.peer, self.kind, MPI.Request.Waitall, self.mpi)
        self._done()

    def test(self) -> bool:
        done = MPI.Request.Testall(self.mpi)
        if done:
            self._done()
        return done

    def _done(self):
        self.comm._stream_ready = False  # the caller may now queue device work
        if self.finish is not None:
            self.finish()
            self.finish = None


class Transport:
    """rank/size, ``split``, buffer-based p2p and traffic counters over an MPI comm."""

    def __init__(self, mpi_comm=None, *, check=None, cuda_aware=None, transport=None,
                 ranks_per_node=None, hang_timeout=None, _is_context=False):
        self.mpi = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank = self.mpi.Get_rank()
        self.size = self.mpi.Get_size()
        self.check = _env_flag("MINIPAR_COMM_CHECK") if check is None else bool(check)
        self.transport = resolve(transport, cuda_aware)  # before any message: one clear line
        self.cuda_aware = self.transport == "cuda-aware"
        self.path = {"staging": staging_path, "pageable": PageablePath, "cuda-aware": CudaAwarePath,
                     "nccl": lambda: NcclPath(self)}[self.transport]()
        self._plain = not self.path.splits_messages  # host arrays straight to MPI
        self._stream_ready = False  # see device_paths: one stream sync per step
        rpn = ranks_per_node or int(os.environ.get("MINIPAR_RANKS_PER_NODE", "0") or 0)
        self.ranks_per_node = rpn or None  # None: nodes from MPI's shared-memory split
        self._hang_timeout = watchdog.register(hang_timeout)  # None: the process-wide one
        self.counters = Counters()
        self._children = []  # contexts and internal splits whose traffic counts as ours
        self._is_context = _is_context
        self._contexts = {}
        self.cache = {}  # per-communicator state of the collectives (sub-comms, cost model)
        self._workspace = {}
        # seconds callers spent in blocking collectives they chose to time on this
        # communicator (tensor parallelism's regions: time on the critical path)
        self.blocking_comm_s = 0.0

    # ----------------------------------------------------------- structure
    def split(self, color, key=0, *, share_counters=False) -> "Transport | None":
        """Collective: ranks with the same ``color`` form a new communicator, ordered by
        ``key`` (then old rank).  ``color=None`` opts out and returns None.
        ``share_counters`` adds the new one's traffic to this one's totals (the
        collectives use it for their internal node/leader communicators)."""
        sub = self._setup(self.mpi.Split, MPI.UNDEFINED if color is None else int(color), int(key))
        if sub == MPI.COMM_NULL:
            return None
        child = self._like(sub, share_counters)
        if share_counters:
            self._children.append(child)
        return child

    def _setup(self, call, *args):
        """A collective MPI setup call (Dup, Split), watched under a hang timeout."""
        if self.hang_timeout is None:
            return call(*args)
        return watchdog.watched(self, None, "communicator setup", call, *args)

    def _like(self, mpi_comm, is_context):
        """A communicator of my class over ``mpi_comm`` with my settings (check, timeout, ...)."""
        return type(self)(mpi_comm, check=self.check, transport=self.transport,
                          ranks_per_node=self.ranks_per_node,
                          hang_timeout=self._hang_timeout, _is_context=is_context)

    def context(self, name: str) -> "Transport":
        """A private duplicate (created collectively on first use) sharing the counters."""
        if self._is_context:
            self._stream_ready = False  # a collective starts: it may have queued packing
            return self
        ctx = self._contexts.get(name)
        if ctx is None:
            ctx = self._like(self._setup(self.mpi.Dup), True)
            ctx.cache = self.cache if name == "coll" else {}
            self._contexts[name] = ctx
            self._children.append(ctx)
        ctx._stream_ready = False  # a collective starts: it may have queued packing
        return ctx

    def workspace(self, count, dtype):
        """A reusable scratch array of ``count`` elements of ``dtype`` for receives.

        One per (dtype, backend), grown on demand: reusing it avoids paging in fresh
        memory on every large collective.  Contents are garbage between uses.
        """
        key = (dtype, backend_name())
        ws = self._workspace.get(key)
        if ws is None or ws.size < count:
            ws = self._workspace[key] = xp.empty(max(int(count), 1024), dtype=dtype)
        return ws[:count]

    @property
    def hang_timeout(self):
        """Seconds a wait on a peer may last before the watchdog ends the job (None: off)."""
        own = self._hang_timeout
        return own if own is not None else watchdog._state["timeout"]

    # ----------------------------------------------------------- counters
    def _total(self, name):
        return getattr(self.counters, name) + sum(c._total(name) for c in self._children)

    bytes_sent = property(lambda self: self._total("bytes_sent"))
    bytes_recv = property(lambda self: self._total("bytes_recv"))
    msgs_sent = property(lambda self: self._total("msgs_sent"))
    msgs_recv = property(lambda self: self._total("msgs_recv"))

    def reset_counters(self):
        self.counters.reset()
        for c in self._children:
            c.reset_counters()

    # ----------------------------------------------------------- p2p
    def _watch(self, peer, kind, call, *args):
        """A blocking MPI call, watched under a hang timeout."""
        if self.hang_timeout is None:
            return call(*args)
        return watchdog.watched(self, peer, kind, call, *args)

    def send(self, buf, dest, tag=0):
        if self._plain and type(buf) is _HOST:
            self._watch(dest, "send", self.mpi.Send, [buf, _BYTE], dest, tag)
        else:
            self.path.send(self, buf, dest, tag)
        self._stream_ready = False
        c = self.counters
        c.bytes_sent += buf.nbytes
        c.msgs_sent += 1

    def recv(self, buf, source, tag=0):
        if self._plain and type(buf) is _HOST:
            self._watch(source, "recv", self.mpi.Recv, [buf, _BYTE], source, tag)
        else:
            self.path.recv(self, buf, source, tag)
        self._stream_ready = False
        c = self.counters
        c.bytes_recv += buf.nbytes
        c.msgs_recv += 1
        return buf

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        """Send to ``dest`` and receive from ``source`` at once (no deadlock in a ring)."""
        if self._plain and type(sendbuf) is _HOST and type(recvbuf) is _HOST:
            if self.hang_timeout is None:  # (the hot path, kept lean)
                self.mpi.Sendrecv([sendbuf, _BYTE], dest, tag, [recvbuf, _BYTE], source, tag)
            else:  # what it waits for is what it receives
                watchdog.watched(self, source, "sendrecv", self.mpi.Sendrecv,
                                 [sendbuf, _BYTE], dest, tag, [recvbuf, _BYTE], source, tag)
        else:
            self.path.sendrecv(self, sendbuf, dest, recvbuf, source, tag)
        self._stream_ready = False
        c = self.counters
        c.bytes_sent += sendbuf.nbytes
        c.bytes_recv += recvbuf.nbytes
        c.msgs_sent += 1
        c.msgs_recv += 1
        return recvbuf

    def isend(self, buf, dest, tag=0) -> Request:
        if self._plain and type(buf) is _HOST:
            reqs, finish = [self.mpi.Isend([buf, _BYTE], dest, tag)], None
        else:
            reqs, finish = self.path.isend(self, buf, dest, tag)
        c = self.counters
        c.bytes_sent += buf.nbytes
        c.msgs_sent += 1
        return Request(reqs, finish, self, dest, "isend (wait)")

    def irecv(self, buf, source, tag=0) -> Request:
        if self._plain and type(buf) is _HOST:
            reqs, finish = [self.mpi.Irecv([buf, _BYTE], source, tag)], None
        else:
            reqs, finish = self.path.irecv(self, buf, source, tag)
        c = self.counters
        c.bytes_recv += buf.nbytes
        c.msgs_recv += 1
        return Request(reqs, finish, self, source, "irecv (wait)")

    @staticmethod
    def wait(req):
        req.wait()

    def waitall(self, reqs):
        self._watch([r.peer for r in reqs], "waitall", MPI.Request.Waitall,
                    [m for r in reqs for m in r.mpi])
        for r in reqs:
            r._done()

    def __repr__(self):
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"

