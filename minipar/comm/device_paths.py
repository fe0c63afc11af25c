"""How a message reaches MPI when its buffer lives on a GPU: the transport's paths.

MPI moves bytes between host addresses; a CuPy array's bytes are in GPU memory.  Three
ways across, one class each (a fourth, ``nccl``, leaves MPI for NCCL: ``nccl_path.py``):

- ``pageable`` — the textbook path: copy device -> a fresh host array, ``MPI_Send``, and
  on the other side ``MPI_Recv`` into a fresh host array, copy host -> device.  Every
  step waits for the one before; the copies go through pageable memory, which the GPU
  cannot read by DMA (the driver bounces them through a pinned buffer of its own).
- ``staging`` — the same detour, pipelined: reused pinned buffers, copies on side
  streams, messages cut into chunks so copy-out, wire and copy-in overlap
  (``staging.py``).
- ``cuda-aware`` — a CUDA-aware MPI (``cuda_aware.py`` asks MPI) takes the device
  buffer itself.  MPI cannot see CUDA streams, though: kernels still queued on the
  current stream may be writing the buffer it is about to read, so the stream must be
  synchronised first — once per collective step, not once per message (below).

``auto`` (the default) takes ``cuda-aware`` where MPI says it is, else ``staging`` on
the CuPy backend, else ``pageable`` (a NumPy run never holds a device array, and
``pageable`` sends host arrays as they are).  Every path sends a message as the same
bytes and counts it once, so the transport's counters are the same whichever is used.

**One sync per step.**  In a collective's private context (``Transport.context``, and
the sub-communicators the algorithms split for themselves) only minipar's algorithms
send, and they queue device work (packing, reductions) at two moments only: when the
collective starts, and after a message completes (a reduction needs the data that
arrived).  So the stream is synchronised before the first device message after either
moment, and the messages posted together in one step (a ``sendrecv``; an ``irecv`` and
an ``isend``; a round of an all-to-all) share that one sync.  On a user's communicator
the transport cannot know what was queued between two calls (a pipeline stage launches
its forward between two ``isend``), so every device message there synchronises.
"""
from __future__ import annotations

import os

import numpy
from mpi4py import MPI

from minipar.backend import backend_name, is_device_array, to_host
from minipar.comm.cuda_aware import cuda_aware

TRANSPORTS = ("auto", "pageable", "staging", "cuda-aware", "nccl")
COLL_TAG = 7  # collectives live in their own context, so one tag is enough
ENV = "MINIPAR_TRANSPORT"
_HOST = numpy.ndarray
_BYTE = MPI.BYTE


def on_device(buf) -> bool:
    return type(buf) is not _HOST and is_device_array(buf)


def check_transport(name):
    """ValueError, one line, for a transport that is not known."""
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORTS)}")


def resolve(transport=None, cuda_aware_flag=None) -> str:
    """The transport a communicator uses: ``transport`` (or ``cuda-aware`` where
    ``cuda_aware_flag``, ``Communicator(cuda_aware=True)``, is True), else
    ``$MINIPAR_TRANSPORT``, else ``auto`` — which ``cuda_aware_flag`` False keeps off
    ``cuda-aware`` — resolved."""
    name = transport or ("cuda-aware" if cuda_aware_flag else None) or os.environ.get(ENV) or "auto"
    check_transport(name)
    if name != "auto":
        return name
    if cuda_aware_flag is not False and cuda_aware():
        return "cuda-aware"
    return "staging" if backend_name() == "cupy" else "pageable"


def current_stream():
    import cupy  # only reached with a CuPy array in hand
    return cupy.cuda.get_current_stream()


class HostPath:
    """Messages as [buffer, bytes] to MPI; subclasses decide what a device buffer becomes
    (``out``: the spec to send and what must outlive the send; ``into``: the spec to
    receive into and what to run once the bytes have landed)."""

    splits_messages = False  # True: a message may go as several MPI messages (staging)

    def out(self, t, buf):
        return [buf, _BYTE], None

    def into(self, t, buf):
        return [buf, _BYTE], None

    def send(self, t, buf, dest, tag):
        spec, _ = self.out(t, buf)
        t._watch(dest, "send", t.mpi.Send, spec, dest, tag)

    def recv(self, t, buf, source, tag):
        spec, finish = self.into(t, buf)
        t._watch(source, "recv", t.mpi.Recv, spec, source, tag)
        if finish:
            finish()

    def sendrecv(self, t, sendbuf, dest, recvbuf, source, tag):
        spec, finish = self.into(t, recvbuf)
        send, _ = self.out(t, sendbuf)
        t._watch(source, "sendrecv", t.mpi.Sendrecv, send, dest, tag, spec, source, tag)
        if finish:
            finish()

    def isend(self, t, buf, dest, tag):
        """([MPI requests], what to run at completion: here, keeping a staged copy alive)."""
        spec, keep = self.out(t, buf)
        return [t.mpi.Isend(spec, dest, tag)], (None if keep is None else lambda: keep)

    def irecv(self, t, buf, source, tag):
        spec, finish = self.into(t, buf)
        return [t.mpi.Irecv(spec, source, tag)], finish


class PageablePath(HostPath):
    """Device arrays through fresh pageable host copies, each copy blocking."""

    def out(self, t, buf):
        if not on_device(buf):
            return [buf, _BYTE], None
        host = to_host(buf)  # waits for the stream, then copies
        return [host, _BYTE], host

    def into(self, t, buf):
        if not on_device(buf):
            return [buf, _BYTE], None
        host = numpy.empty(buf.shape, dtype=buf.dtype)
        return [host, _BYTE], lambda: buf.set(host)


class CudaAwarePath(HostPath):
    """Device arrays to MPI as they are, after one stream sync per step (module doc)."""

    def out(self, t, buf):
        if on_device(buf):
            self.ready(t)
        return [buf, _BYTE], None

    into = out

    @staticmethod
    def ready(t):
        """Synchronise the current stream unless this step already did (module doc)."""
        if not (t._is_context and t._stream_ready):
            current_stream().synchronize()
            t._stream_ready = True

