"""A ring all-reduce that the caller advances: overlap without a spare core.

The progress thread of ``nonblocking.py`` overlaps a bucket's all-reduce with backward
when the thread has a core of its own.  With ranks filling the cores (2 ranks on 2
cores) it has none: it takes its core from backward's compute, and waiting for the GIL
between two messages delays the transfer too — measured, overlap hid most of the
exposed all-reduce yet made the step slower.  A transfer needs the CPU only to *start*
and to *reduce*: the bytes move while the rank computes.  So the same ring all-reduce
is written as a sequence of steps, each step one non-blocking send and receive:

    step s < p-1 (reduce-scatter):  send chunk (r-s-1) ->, receive chunk (r-s-2) <-,
                                    then chunk (r-s-2) += received
    step s ≥ p-1 (all-gather):      send chunk (r-s') ->, receive chunk (r-s'-1) into place

``progress()`` tests the current step's two requests; if both have completed it does
the step's reduction, posts the next step's messages and tests again — it never
blocks.  ``wait()`` polls every stepped all-reduce in flight on the communicator
until its own is done (MPI's ``Wait`` polls too, in MPICH).  DDP calls it at every gradient hook of backward, in the main thread; ``wait()``
drives the rest to completion.  The chunks, steps and reduction operand order are those
of ``ring.py``'s all-reduce, so the result is bit-identical to the blocking one.

Several may be in flight on one communicator at once (one per bucket).  Each gets a tag
of its own — the k-th started on a communicator gets tag k on every rank, since all ranks
start them in the same order — so the messages of two buckets can never be matched to
each other's receives, whichever bucket a rank advances first.
"""
from __future__ import annotations

import time

from minipar.backend import xp
from minipar.comm import watchdog
from minipar.comm.chunks import ufunc
from minipar.comm.exchange import SEGMENT_BYTES, _reduce_into
from minipar.comm.ring import _plan

FIRST_TAG, TAGS = 100, 30000      # MPI guarantees tags up to 32767


class SteppedAllReduce:
    """A ring all-reduce of the 1-D ``buf`` in place, advanced by ``progress()``."""

    def __init__(self, comm, buf, op="sum"):
        if buf.ndim != 1 or not buf.flags.c_contiguous:
            raise ValueError(f"a stepped all-reduce works on a contiguous 1-D buffer, got "
                             f"shape {buf.shape}")
        self.ctx = comm.context("stepwise")      # its own MPI context: no mix with others
        self.buf, self.reduce = buf, ufunc(op)
        self.started_at = time.perf_counter()
        self.finished_at = None
        if self.ctx.size == 1 or buf.size == 0:
            self.steps, self.finished_at = [], self.started_at
            return
        self.in_flight = self.ctx.cache.setdefault("stepwise_in_flight", [])
        self.in_flight.append(self)
        count = self.ctx.cache.get("stepwise_started", 0)
        self.ctx.cache["stepwise_started"] = count + 1
        self.tag = FIRST_TAG + count % TAGS
        self.right, self.left, _, rs, ag = _plan(self.ctx, buf.size, buf.itemsize, SEGMENT_BYTES)
        self.steps = [(True, s) for s in rs] + [(False, s) for s in ag]   # one message a step
        self.scratch = xp.empty(max(hi - lo for _, _, lo, hi in rs), dtype=buf.dtype)
        self.index = 0
        self._post()

    def _post(self):
        reducing, (slo, shi, rlo, rhi) = self.steps[self.index]
        into = self.scratch[:rhi - rlo] if reducing else self.buf[rlo:rhi]
        self.recv = self.ctx.irecv(into, self.left, self.tag)
        self.send = self.ctx.isend(self.buf[slo:shi], self.right, self.tag)

    def test(self) -> bool:
        return self.finished_at is not None

    def progress(self) -> bool:
        """Do every step whose messages have arrived; never blocks.  True when done."""
        while self.finished_at is None and self.recv.test() and self.send.test():
            self._complete_step()
        return self.finished_at is not None

    def wait(self, timeout=None):
        """Finish the all-reduce; returns ``buf``.  While it waits it advances every
        stepped all-reduce in flight on the communicator, as MPI's progress engine
        does: a rank waiting for bucket A must still pass on bucket B's chunks, or a
        neighbour waiting for B first, then A, would wait for ever."""
        if self.finished_at is None:
            rec = watchdog.begin(self.ctx, self.left, "stepped all_reduce (wait)") \
                if self.ctx.hang_timeout is not None else None
            try:
                while self.finished_at is None:
                    for other in list(self.in_flight):
                        other.progress()
            finally:
                if rec is not None:
                    watchdog.end(rec)
        return self.buf

    def _complete_step(self):
        reducing, (_, _, rlo, rhi) = self.steps[self.index]
        if reducing:
            _reduce_into(self.buf[rlo:rhi], self.scratch[:rhi - rlo], self.reduce, False)
        self.index += 1
        if self.index < len(self.steps):
            self._post()
        else:
            self.finished_at = time.perf_counter()
            self.in_flight.remove(self)


def all_reduce_stepped(comm, buf, op="sum"):
    """Start a :class:`SteppedAllReduce` of ``buf`` (1-D, contiguous, in place)."""
    return SteppedAllReduce(comm, buf, op)
