"""minipar's own algorithms over NCCL's point-to-point send/recv: the ``nccl`` transport.

NCCL moves GPU memory between GPUs by the fastest way there is (NVLink, PCIe peer to
peer, GPUDirect RDMA), and it is *stream-ordered*: ``send``/``recv`` are queued on a CUDA
stream like kernels.  Queued on the compute stream, they run after the kernels that wrote
the data and before the kernels that read what arrived, so the host never waits for the
device: no sync, no copy, no staging.  The ring, tree and hierarchical all-reduce written
in this package then run over NVLink, message for message as over MPI.

Two things differ from MPI, and shape this path:

- **groups.**  An NCCL send waits (on the GPU) for the matching receive.  A ring step
  where every rank first sends, then receives, would deadlock; inside
  ``groupStart()``/``groupEnd()`` the calls are issued together.  So an ``isend`` or
  ``irecv`` is only *noted*, and the notes go as one group at the first wait (or test) —
  exactly the messages the algorithm posted together; a ``sendrecv`` is a group of two.
- **no tags.**  NCCL matches a pair's messages in the order they were posted.  minipar's
  algorithms on a collective's private context post in the same order at both ends, with
  one tag (``COLL_TAG``): those go over NCCL.  Everything else — a user's messages, the
  stepped all-reduce's several tags in flight, host arrays — goes by the staging path,
  which MPI matches by tag.

One NCCL communicator per minipar communicator (made when it is, collectively: rank 0's
``get_unique_id`` broadcast over MPI).  NCCL refuses two ranks on one GPU, so this path
needs a GPU per rank (``--share-gpus`` is refused with it).
"""
from __future__ import annotations

from minipar.comm.device_paths import COLL_TAG, current_stream, on_device
from minipar.comm.staging import StagingPath, staging_path


def nccl_module():
    """``cupy.cuda.nccl``, or ValueError (one line) where the run cannot have it."""
    from minipar.backend import backend_name
    if backend_name() != "cupy":
        raise ValueError("transport 'nccl' moves device arrays: it needs --backend cupy")
    try:
        from cupy.cuda import nccl
        nccl.get_version()
    except Exception as err:  # ImportError, or a CuPy built without NCCL
        raise ValueError(f"transport 'nccl' needs CuPy with NCCL (cupy.cuda.nccl): {err}") from None
    return nccl


class NcclPath(StagingPath):
    """Device messages of the collectives over NCCL, grouped; the rest staged (module doc)."""

    def __init__(self, t):
        self.nccl = nccl_module()   # before any message: one clear line where it cannot be
        staging = staging_path()     # the rest is staged through the process's pinned buffers
        super().__init__(staging.chunk_bytes)
        self.slots, self._streams = staging.slots, staging._side_streams()
        uid = self.nccl.get_unique_id() if t.rank == 0 else None
        uid = t.mpi.bcast(uid, root=0)   # setup: a few bytes, not counted
        self.comm = self.nccl.NcclCommunicator(t.size, uid, t.rank)
        self.noted = []   # (send or recv, buffer, peer) posted, not yet issued

    @staticmethod
    def takes(t, tag, *bufs):
        return t._is_context and tag == COLL_TAG and all(on_device(b) for b in bufs)

    def issue(self):
        """Everything noted, as one NCCL group on the current stream."""
        if not self.noted:
            return
        stream, uint8 = current_stream().ptr, self.nccl.NCCL_UINT8
        self.nccl.groupStart()
        for call, buf, peer in self.noted:
            call(buf.data.ptr, buf.nbytes, uint8, peer, stream)
        self.nccl.groupEnd()
        self.noted = []

    def send(self, t, buf, dest, tag):
        if not self.takes(t, tag, buf):
            return super().send(t, buf, dest, tag)
        self.noted.append((self.comm.send, buf, dest))
        self.issue()

    def recv(self, t, buf, source, tag):
        if not self.takes(t, tag, buf):
            return super().recv(t, buf, source, tag)
        self.noted.append((self.comm.recv, buf, source))
        self.issue()

    def sendrecv(self, t, sendbuf, dest, recvbuf, source, tag):
        if not self.takes(t, tag, sendbuf, recvbuf):
            return super().sendrecv(t, sendbuf, dest, recvbuf, source, tag)
        self.noted += [(self.comm.recv, recvbuf, source), (self.comm.send, sendbuf, dest)]
        self.issue()

    def isend(self, t, buf, dest, tag):
        if not self.takes(t, tag, buf):
            return super().isend(t, buf, dest, tag)
        self.noted.append((self.comm.send, buf, dest))
        return [], self.issue   # no MPI request: the wait issues the group

    def irecv(self, t, buf, source, tag):
        if not self.takes(t, tag, buf):
            return super().irecv(t, buf, source, tag)
        self.noted.append((self.comm.recv, buf, source))
        return [], self.issue

    def all_reduce(self, buf):
        """NCCL's own all-reduce (sum, in place) of the device array ``buf``: the baseline
        ``bench comm`` times minipar's algorithms against over the same GPUs."""
        kind = getattr(self.nccl, f"NCCL_{buf.dtype.name.upper()}")
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, kind, self.nccl.NCCL_SUM,
                            current_stream().ptr)
