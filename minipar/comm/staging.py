"""Device messages through pinned host buffers, pipelined in chunks: the staging transport.

Where MPI cannot read GPU memory, a message goes device -> host -> wire -> host -> device.
Done naively (``device_paths.PageablePath``) the three legs run one after the other, and
each copy goes through pageable memory, which the GPU cannot reach by DMA.  Here:

- **pinned buffers.**  Page-locked host memory (``cupy.cuda.alloc_pinned_memory``), which
  the GPU's copy engines read and write directly, so a copy can run *asynchronously* while
  the host does something else.  Pinning is slow (a system call, pages locked), so the
  buffers are allocated once, chunk-sized, and reused from a free list (``PinnedSlots``).
- **side streams.**  The copies are queued on two streams of their own (one per
  direction: a GPU has a copy engine each way), not on the compute stream, and ordered
  against it by events: the copies wait for the kernels that wrote the data
  (``wait_event``), and the kernels that read received data wait for the copy — the host
  blocks only where it must hand bytes to MPI.
- **chunks.**  A message of S bytes goes as ceil(S / C) MPI messages of C bytes (the last
  shorter), two pinned slots each way used in turn, so that at step i

      copy-out of chunk i+1   |   the wire carries chunk i   |   copy-in of chunk i-1

  all run at once: the time of a message falls from  t_d2h + t_wire + t_h2d  to about
  max(t_d2h, t_wire, t_h2d)·S/C + one chunk of each.  Smaller chunks overlap more and pay
  one latency (α) each; C = 1 MiB by default (``MINIPAR_STAGING_CHUNK_BYTES``, the same on
  every rank: both ends cut a message alike).

Every message over C bytes is cut, host or device, so that both ends always agree on the
pieces whatever memory each holds; the transport counts the message once, as the other
paths do.  A non-blocking ``isend``/``irecv`` cannot pipeline (nothing runs the steps
between the calls): it stages the whole message through as many slots as it has chunks.
"""
from __future__ import annotations

import os
import threading

import numpy
from mpi4py import MPI

from minipar.comm.device_paths import HostPath, current_stream, on_device

CHUNK_ENV = "MINIPAR_STAGING_CHUNK_BYTES"
DEFAULT_CHUNK_BYTES = 1 << 20
_BYTE = MPI.BYTE
_NO_BYTES = numpy.empty(0, numpy.uint8)


def as_bytes(buf):
    """The bytes of a contiguous array, as a 1-D uint8 view (device or host)."""
    return buf.reshape(-1).view(numpy.uint8)


class PinnedSlots:
    """Chunk-sized pinned host buffers, allocated on first need and reused for ever.

    A slot given back may still be read by a copy queued on a side stream: it comes back
    with that copy's event, and ``take`` waits for the event before handing it out again."""

    def __init__(self, chunk_bytes):
        self.chunk_bytes = chunk_bytes
        self.free, self.allocated = [], 0
        self.lock = threading.Lock()   # the progress thread stages too

    def take(self):
        with self.lock:
            slot = self.free.pop() if self.free else None
        if slot is None:
            import cupy
            memory = cupy.cuda.alloc_pinned_memory(self.chunk_bytes)
            slot = [numpy.ndarray((self.chunk_bytes,), numpy.uint8, buffer=memory), memory, None]
            self.allocated += 1
        if slot[2] is not None:
            slot[2].synchronize()  # the last copy that used it is done
            slot[2] = None
        return slot

    def give(self, slot, pending=None):
        slot[2] = pending
        with self.lock:
            self.free.append(slot)


class _Outgoing:
    """A message leaving: its chunk i as host bytes MPI can read (``chunk(i)``).  With
    ``reuse`` two slots take turns (chunk i+2 is copied out after chunk i was sent);
    without, each chunk has a slot of its own."""

    def __init__(self, path, buf, reuse=True):
        self.path, self.n, self.reuse = path, buf.nbytes, reuse
        self.count = path.chunks(self.n)
        self.device = on_device(buf) and self.n > 0
        self.bytes = as_bytes(buf) if self.n else _NO_BYTES
        self.slots, self.copied = [], {}
        if self.device:  # the copies out wait for the kernels that wrote the buffer
            path.d2h.wait_event(current_stream().record())

    def chunk(self, i, ahead=1):
        """Chunk i on the host; first queues the copy-out of the ``ahead`` chunks after it."""
        lo, hi = self.path.bounds(self.n, i)
        if not self.device:
            return [self.bytes[lo:hi], _BYTE]
        for j in range(i, min(i + ahead + 1, self.count)):
            if j not in self.copied:
                self._copy_out(j)
        slot, done = self.copied.pop(i)
        done.synchronize()  # MPI reads the pinned bytes now: they must have landed
        return [slot[0][:hi - lo], _BYTE]

    def _copy_out(self, j):
        k = j % 2 if self.reuse else j
        if len(self.slots) <= k:
            self.slots.append(self.path.slots.take())
        lo, hi = self.path.bounds(self.n, j)
        slot = self.slots[k]
        self.bytes[lo:hi].get(stream=self.path.d2h, out=slot[0][:hi - lo], blocking=False)
        self.copied[j] = (slot, self.path.d2h.record())

    def close(self):
        for slot in self.slots:
            self.path.slots.give(slot)


class _Incoming:
    """A message arriving: host bytes MPI writes chunk i into (``chunk(i)``), copied to
    the device once it has landed (``landed(i)``)."""

    def __init__(self, path, buf, reuse=True):
        self.path, self.n, self.reuse = path, buf.nbytes, reuse
        self.count = path.chunks(self.n)
        self.device = on_device(buf) and self.n > 0
        self.bytes = as_bytes(buf) if self.n else _NO_BYTES
        self.slots, self.last = [], None
        if self.device:  # the copies in must wait for kernels still using the buffer
            path.h2d.wait_event(current_stream().record())

    def chunk(self, i):
        lo, hi = self.path.bounds(self.n, i)
        if not self.device:
            return [self.bytes[lo:hi], _BYTE]
        k = i % 2 if self.reuse else i
        if len(self.slots) <= k:
            self.slots.append([self.path.slots.take(), None])
        entry = self.slots[k]
        if entry[1] is not None:  # the copy-in of chunk i-2 still reads this slot
            entry[1].synchronize()
            entry[1] = None
        return [entry[0][0][:hi - lo], _BYTE]

    def landed(self, i):
        if not self.device:
            return
        lo, hi = self.path.bounds(self.n, i)
        entry = self.slots[i % 2 if self.reuse else i]
        self.bytes[lo:hi].set(entry[0][0][:hi - lo], stream=self.path.h2d)
        entry[1] = self.last = self.path.h2d.record()

    def close(self):
        if self.last is not None:  # later kernels on the compute stream see the bytes
            current_stream().wait_event(self.last)
        for slot, pending in self.slots:
            self.path.slots.give(slot, pending)


class StagingPath(HostPath):
    """The staging transport's path (module doc): one per process, shared by its
    communicators, with its pinned slots and side streams."""

    splits_messages = True

    def __init__(self, chunk_bytes):
        self.chunk_bytes = chunk_bytes
        self.slots = PinnedSlots(chunk_bytes)
        self._streams = None

    def chunks(self, nbytes):
        return max(1, -(-nbytes // self.chunk_bytes))

    def bounds(self, nbytes, i):
        return i * self.chunk_bytes, min(nbytes, (i + 1) * self.chunk_bytes)

    @property
    def d2h(self):
        return self._side_streams()[0]

    @property
    def h2d(self):
        return self._side_streams()[1]

    def _side_streams(self):
        if self._streams is None:  # made on first use: the rank's device is chosen by then
            import cupy
            self._streams = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True))
        return self._streams

    # ------------------------------------------------------------ blocking: pipelined
    def _pipeline(self, t, out, dest, inc, source, tag, kind):
        """Step i: post the receive of chunk i and the send of chunk i (the copy-out of
        chunk i+1 queued first), wait for both, queue the copy-in of chunk i."""
        steps = max(out.count if out else 0, inc.count if inc else 0)
        try:
            for i in range(steps):
                reqs = []
                if inc is not None and i < inc.count:
                    reqs.append(t.mpi.Irecv(inc.chunk(i), source, tag))
                if out is not None and i < out.count:
                    reqs.append(t.mpi.Isend(out.chunk(i), dest, tag))
                t._watch(source if inc is not None else dest, kind, MPI.Request.Waitall, reqs)
                if inc is not None and i < inc.count:
                    inc.landed(i)
        finally:
            for end in (out, inc):
                if end is not None:
                    end.close()

    def send(self, t, buf, dest, tag):
        self._pipeline(t, _Outgoing(self, buf), dest, None, None, tag, "send")

    def recv(self, t, buf, source, tag):
        self._pipeline(t, None, None, _Incoming(self, buf), source, tag, "recv")

    def sendrecv(self, t, sendbuf, dest, recvbuf, source, tag):
        inc = _Incoming(self, recvbuf)
        self._pipeline(t, _Outgoing(self, sendbuf), dest, inc, source, tag, "sendrecv")

    # ------------------------------------------------------------ non-blocking: whole
    def isend(self, t, buf, dest, tag):
        out = _Outgoing(self, buf, reuse=False)  # all chunks in flight at once
        specs = [out.chunk(i, ahead=out.count) for i in range(out.count)]
        return [t.mpi.Isend(spec, dest, tag) for spec in specs], out.close

    def irecv(self, t, buf, source, tag):
        inc = _Incoming(self, buf, reuse=False)
        reqs = [t.mpi.Irecv(inc.chunk(i), source, tag) for i in range(inc.count)]

        def finish():
            for i in range(inc.count):
                inc.landed(i)
            inc.close()
        return reqs, finish


_paths = {}


def staging_path() -> StagingPath:
    """The process's staging path (pinned slots are per process, not per communicator),
    for the chunk size ``$MINIPAR_STAGING_CHUNK_BYTES`` (default 1 MiB)."""
    text = os.environ.get(CHUNK_ENV) or str(DEFAULT_CHUNK_BYTES)
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(f"{CHUNK_ENV}={text!r}: the chunk must be a positive number of bytes")
    chunk = int(text)
    if chunk not in _paths:
        _paths[chunk] = StagingPath(chunk)
    return _paths[chunk]
