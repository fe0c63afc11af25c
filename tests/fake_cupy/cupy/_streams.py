"""Fake-only: CUDA streams, events, pinned host memory and asynchronous copies.

The fake's kernels run at once, in program order: that is the *null stream* (the default),
and nothing is ever queued on it.  A stream made with ``cuda.Stream()`` is a side stream,
and there the fake is asynchronous as a GPU is: an asynchronous copy (``a.get(stream=s,
out=pinned, blocking=False)``, ``a.set(pinned, stream=s)``) is only *queued*, and runs
when something waits for it — ``event.synchronize()`` of an event recorded after it,
``s.synchronize()``, ``Device.synchronize()``, or ``null.wait_event(event)`` (the null
stream's next kernel runs at once here, so what it waits for must have run).  Code that
forgets a wait reads a device buffer before the copy into it, or sends host bytes before
the copy out: stale bytes, which a test sees.  A copy reads its source when it runs, as
a GPU's does.

What the copies did is written to ``cupy._counts.stream_log``, in order, as tuples:

    ("queue", stream, "d2h" | "h2d", nbytes)   a copy queued on a side stream
    ("run", stream, "d2h" | "h2d", nbytes)     that copy carried out
    ("host waits", stream)                     the host blocked on an event of ``stream``
    ("stream waits", waiter, stream)           ``waiter`` ordered after an event of ``stream``

and ``cupy._counts.pinned_allocs`` / ``pinned_bytes`` count ``alloc_pinned_memory`` calls.
A host wait on a side stream's event is logged, not added to ``cupy._counts.syncs``: that
counts drains of the compute stream, which such a wait leaves running.
An asynchronous copy to or from pageable memory is synchronous, as in CUDA.
"""
import itertools
import threading

import numpy

from cupy._counters import counts

_names = itertools.count(1)
_pinned = []   # (address, nbytes) of every pinned allocation
_running = threading.Lock()


class PinnedMemoryPointer(bytearray):
    """Page-locked host memory (here: ordinary memory, remembered as pinned)."""

    @property
    def ptr(self):
        return numpy.frombuffer(self, numpy.uint8).ctypes.data


def alloc_pinned_memory(nbytes):
    memory = PinnedMemoryPointer(int(nbytes))
    _pinned.append((memory.ptr, int(nbytes)))
    counts.pinned_allocs += 1
    counts.pinned_bytes += int(nbytes)
    return memory


def is_pinned(host):
    """Whether the NumPy array ``host`` lies in pinned memory."""
    lo = host.ctypes.data
    return any(start <= lo and lo + host.nbytes <= start + n for start, n in _pinned)


class Stream:
    """A stream: the null stream (``Stream.null``; every fake kernel runs on it, at once)
    or a side stream, whose copies wait in ``queue`` until something waits for them."""

    def __init__(self, null=False, non_blocking=False, ptr=0):
        self.name = "null" if null else f"side{next(_names)}"
        self.is_null, self.ptr = null, 0 if null else id(self)   # the null stream's handle is 0
        self.queue, self.queued, self.ran = [], 0, 0
        if not null:
            _side_streams.append(self)

    def record(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        if event.stream is None or event.stream is self:
            return
        counts.stream_log.append(("stream waits", self.name, event.stream.name))
        if self.is_null:  # its next kernel runs now: what it waits for must have run
            event.stream._run(event.position)

    def synchronize(self):
        counts.synchronize()
        self._run(self.queued)

    def _queue(self, direction, nbytes, copy):
        counts.stream_log.append(("queue", self.name, direction, nbytes))
        self.queue.append((direction, nbytes, copy))
        self.queued += 1

    def _run(self, position):
        with _running:          # two host threads may wait on one stream (a GPU serialises its copies)
            while self.ran < position:
                direction, nbytes, copy = self.queue.pop(0)
                copy()
                counts.stream_log.append(("run", self.name, direction, nbytes))
                self.ran += 1

    def __enter__(self):
        global _current
        self._previous, _current = _current, self
        return self

    def __exit__(self, *exc):
        global _current
        _current = self._previous


class Event:
    """A point in a stream: ``synchronize()`` blocks the host until the stream got there."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.stream, self.position = None, 0

    def record(self, stream=None):
        self.stream = stream or _current
        self.position = self.stream.queued

    def synchronize(self):
        if self.stream is not None and not self.stream.is_null:
            counts.stream_log.append(("host waits", self.stream.name))
            self.stream._run(self.position)

    @property
    def done(self):
        return self.stream is None or self.stream.ran >= self.position


_side_streams = []
Stream.null = _current = Stream(null=True)


def get_current_stream():
    return _current


def synchronize_all():
    """``Device.synchronize()``: every stream's queued work done."""
    for stream in _side_streams:
        stream._run(stream.queued)


def copy_to_host(device, out, stream, blocking):
    """``device.get(stream=, out=, blocking=)``: queued where CUDA would queue it (a side
    stream, pinned ``out``, not blocking); else at once.  Returns whether it was queued."""
    if stream is None or stream.is_null or blocking or out is None or not is_pinned(out):
        return False
    stream._queue("d2h", out.nbytes, lambda: out.__setitem__(Ellipsis, device))
    return True


def copy_to_device(device, host, stream):
    """``device.set(host, stream=)``: queued on a side stream from pinned memory."""
    if stream is None or stream.is_null or not is_pinned(host):
        return False
    stream._queue("h2d", host.nbytes, lambda: device.__setitem__(Ellipsis, host))
    return True
