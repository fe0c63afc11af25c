"""The transport's device paths in one process (``MPI.COMM_SELF``: a rank sends to itself),
on the fake CuPy of ``tests/fake_cupy``, which records the side streams' copies in order.

Prints one JSON object:

- ``order``: a 5-chunk ``sendrecv`` through the staging path — the fake's stream log with
  the messages MPI was handed interleaved (``("wire", "send" | "recv", nbytes)``);
- ``pinned``: pinned allocations after that message and after three more (reused: equal);
- ``same_bytes``: each path delivered the bytes sent (sendrecv, send+recv, isend+irecv,
  a zero-byte message), and ``counters``: each path's counters for those calls;
- ``syncs``: stream syncs of the cuda-aware path for the same calls on a collective's
  context (one per step) and on the user's communicator (one per device message).
"""
import json
import os

import numpy as np

os.environ["MINIPAR_STAGING_CHUNK_BYTES"] = "64"
os.environ["MINIPAR_CUDA_AWARE"] = "1"   # the fake hands MPI its arrays only then
from mpi4py import MPI  # noqa: E402

import cupy  # noqa: E402  (the fake)

from minipar.backend import set_backend, xp  # noqa: E402
from minipar.comm.transport import Transport  # noqa: E402

set_backend("cupy")
log = cupy._counts.stream_log


class Recorded:
    """An MPI communicator whose sends and receives are written into the stream log."""

    def __init__(self, mpi):
        self.mpi = mpi

    def Isend(self, spec, dest, tag):
        log.append(("wire", "send", spec[0].nbytes))
        return self.mpi.Isend(spec, dest, tag)

    def Irecv(self, spec, source, tag):
        log.append(("wire", "recv", spec[0].nbytes))
        return self.mpi.Irecv(spec, source, tag)

    def __getattr__(self, name):
        return getattr(self.mpi, name)


def exercise(t):
    """Four kinds of message of device arrays to itself; whether each arrived intact."""
    ok = []
    for n in (37, 300):   # one chunk; five (64 bytes each, the last 44)
        x, y = xp.asarray(np.arange(n, dtype=np.uint8)), xp.zeros(n, dtype=xp.uint8)
        t.sendrecv(x, 0, y, 0)
        ok.append(bool((y == x).all()))
        z = xp.zeros(n, dtype=xp.uint8)
        r = t.irecv(z, 0)
        t.waitall([t.isend(x, 0), r])
        ok.append(bool((z == x).all()))
    t.sendrecv(xp.zeros(0), 0, xp.zeros(0), 0)
    return ok


def main():
    out = {"same_bytes": {}, "counters": {}}
    staging = Transport(MPI.COMM_SELF, transport="staging")
    staging.mpi = Recorded(staging.mpi)
    x = xp.asarray(np.arange(300, dtype=np.uint8))
    y = xp.zeros(300, dtype=xp.uint8)
    log.clear()
    staging.sendrecv(x, 0, y, 0)
    out["order"] = [list(e) for e in log]
    out["pinned"] = [cupy._counts.pinned_allocs]
    for _ in range(3):
        staging.sendrecv(x, 0, y, 0)
    out["pinned"].append(cupy._counts.pinned_allocs)
    out["delivered"] = bool((y == x).all())
    for name in ("pageable", "staging", "cuda-aware"):
        t = Transport(MPI.COMM_SELF, transport=name)
        out["same_bytes"][name] = exercise(t)
        out["counters"][name] = [t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv]
    aware = Transport(MPI.COMM_SELF, transport="cuda-aware")
    out["syncs"] = {}
    for where, t in (("context", aware.context("coll")), ("user", aware)):
        before = cupy._counts.syncs
        a, b = xp.ones(10), xp.zeros(10)
        t.sendrecv(a, 0, b, 0)        # one step: one send, one receive
        r = t.irecv(b, 0)              # one step: a receive and a send posted together
        s = t.isend(a, 0)
        t.waitall([r, s])
        out["syncs"][where] = cupy._counts.syncs - before
    print(json.dumps(out))


if __name__ == "__main__":
    main()
