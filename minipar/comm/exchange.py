"""The building block of every reducing algorithm: send one buffer while receiving the
partner's data and reducing it into another — pipelined in segments.

    recv[:] = op(recv, data arriving from src)      while      send ──> dest

A large message is cut into ``nseg`` segments and received into two alternating
scratch slots: while segment k is being reduced, segment k+1 is already in flight.
Besides overlapping transfer and reduction, this keeps the scratch data in cache
(each slot is reduced right after it lands), and it bounds the scratch memory to two
segments however large the buffer.  Each segment adds one message (one α) to the
cost: ``nseg·α + S·β + S·γ`` instead of ``α + S·β + S·γ``.

``nseg`` must be the same on both ends of every message, so callers derive it from
quantities all ranks know (the largest chunk, the window size), never from the local
send size alone.

Operand order: the reduction is ``op(mine, theirs)``, or ``op(theirs, mine)`` with
``theirs_first``.  It matters when both partners compute the same element (recursive
doubling): IEEE ``+`` of two NaNs returns one of the two payloads, and ``max(-0.0,
+0.0)`` either zero, depending on the operand order — so both partners must use the
same order, or the replicas differ in their bits.  And the same *aliasing*: NumPy picks
another inner loop (measured: one that swaps a commutative op's operands, for one
element) when ``out`` is the second operand instead of the first.  So both compute
``op(first, second, out=first)``: with ``theirs_first`` the first operand is the scratch
copy of the partner's data, reduced there and copied into ``recv`` (S more bytes of
copying — recursive doubling is the small-message algorithm).

Why 1 MiB: every segment is a separate message, and for large messages MPI uses a
rendezvous (handshake, then one copy), so each extra segment costs a round trip during
which neither side computes.  Measured at p=2 on 2 cores (MPICH, shared memory), 256 KiB
segments made a 1 MiB ring all-reduce ~20% slower and a 1 MiB recursive doubling 2.5x
slower than one message; from 16 MiB up, 1 MiB segments beat both 256 KiB ones and no
pipelining (the reduction then runs on cache-resident slots).
"""
from __future__ import annotations

from minipar.comm.transport import COLL_TAG

SEGMENT_BYTES = 1 << 20  # pipeline segment (see below)


def exchange_reduce(comm, send, dest, recv, src, reduce, nseg=1, tag=COLL_TAG,
                    theirs_first=False):
    """Send ``send`` to ``dest``; reduce what ``src`` sends into ``recv`` (in place).

    ``send`` and ``recv`` may be the same buffer (recursive doubling): a segment is
    only overwritten after its send has completed.  ``theirs_first``: reduce as
    ``op(theirs, mine)`` instead of ``op(mine, theirs)`` (see above).
    """
    ns, nr = send.size, recv.size
    if nseg <= 1:
        tmp = comm.workspace(nr, recv.dtype)
        comm.sendrecv(send, dest, tmp, src, tag)
        _reduce_into(recv, tmp, reduce, theirs_first)
        return
    slot = -(-nr // nseg)
    tmp = comm.workspace(2 * slot, recv.dtype)

    def piece(a, n, k):
        return a[n * k // nseg: n * (k + 1) // nseg]

    first = piece(recv, nr, 0)
    rreq = comm.irecv(tmp[:first.size], src, tag)
    sreqs = [comm.isend(piece(send, ns, 0), dest, tag)]
    for k in range(nseg):
        rreq.wait()
        part = piece(recv, nr, k)
        landed = tmp[(k % 2) * slot: (k % 2) * slot + part.size]
        if k + 1 < nseg:  # put the next segment in flight before reducing this one
            nxt = piece(recv, nr, k + 1)
            off = ((k + 1) % 2) * slot
            rreq = comm.irecv(tmp[off: off + nxt.size], src, tag)
            sreqs.append(comm.isend(piece(send, ns, k + 1), dest, tag))
        sreqs[k].wait()  # its bytes have left: safe even when send is recv
        _reduce_into(part, landed, reduce, theirs_first)
    comm.waitall(sreqs[nseg - 1:])


def _reduce_into(mine, theirs, reduce, theirs_first):
    """mine[:] = op(mine, theirs), or op(theirs, mine) — always as op(a, b, out=a)."""
    if theirs_first:
        reduce(theirs, mine, out=theirs)
        mine[...] = theirs
    else:
        reduce(mine, theirs, out=mine)


def exchange(comm, send, dest, recv, src, nseg=1, tag=COLL_TAG):
    """Plain swap, no reduction: ``recv`` <- what ``src`` sends, ``send`` -> ``dest``;
    ``send`` and ``recv`` must not overlap.

    With ``nseg`` > 1 the message goes as ``nseg`` segments, two in flight each way, as
    in ``exchange_reduce``.  A copy has nothing to overlap, yet one message per flow is
    fragile where flows share a wire: on the simulated cluster (1 Gbit/s), two flows
    through one link, each a 16 MiB swap, took 278 to 535 ms as one message each (one
    flow at times stalls while the other holds the link) and 278 to 284 ms in 1 MiB
    segments (``benchmarks/cluster_links.py``, the hierarchical all-reduce's gather)."""
    if nseg <= 1:
        comm.sendrecv(send, dest, recv, src, tag)
        return
    ns, nr = send.size, recv.size

    def piece(a, n, k):
        return a[n * k // nseg: n * (k + 1) // nseg]

    def post(k):
        return comm.irecv(piece(recv, nr, k), src, tag), comm.isend(piece(send, ns, k), dest, tag)
    flight = [post(k) for k in range(min(2, nseg))]
    for k in range(nseg):
        comm.waitall(flight[k])
        if k + 2 < nseg:
            flight.append(post(k + 2))
