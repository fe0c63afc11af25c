"""Ring algorithms: reduce-scatter, all-gather and all-reduce = reduce-scatter + all-gather.

The p ranks form a ring; the buffer of S bytes is cut into p chunks (array_split
boundaries, see ``chunks.py``).  At step s = 0..p-2 every rank passes one chunk to its
right neighbour and takes one from its left, so all links are busy at once:

- reduce-scatter: rank r sends chunk (r-s-1) and reduces the incoming chunk (r-s-2)
  into its own copy; after p-1 steps rank r holds chunk r fully reduced.
  Cost: (p-1)·α + (p-1)/p·S·β + (p-1)/p·S·γ.
- all-gather: rank r sends chunk (r-s) and stores the incoming chunk (r-s-1).
  Cost: (p-1)·α + (p-1)/p·S·β.
- all-reduce: both — 2(p-1)·α + 2(p-1)/p·S·β + (p-1)/p·S·γ; every rank sends
  (and receives) 2(p-1)/p·S bytes, which is optimal for bandwidth, independent of p.

Large chunks are pipelined in segments (``exchange_reduce``); the all-gather's copies
too where the ring spans nodes (``exchange``).  ``order`` lets a caller
run the ring over a permutation of the ranks (broadcast runs it in root-relative order):
``order[i]`` is the rank at ring position i, and position i owns chunk i.
"""
from __future__ import annotations

from minipar.comm.chunks import chunk_bounds, segments
from minipar.comm.exchange import SEGMENT_BYTES, exchange, exchange_reduce
from minipar.comm.nodes import spans_nodes


def _place(comm, order):
    """(my ring position, right neighbour, left neighbour)."""
    p = comm.size
    if order is None:
        r = comm.rank
        return r, (r + 1) % p, (r - 1) % p
    pos = order.index(comm.rank)
    return pos, order[(pos + 1) % p], order[(pos - 1) % p]


def _steps(p, pos, b, shift):
    """[(send lo, send hi, recv lo, recv hi)] for steps s = 0..p-2: send chunk
    (pos-s-shift), receive chunk (pos-s-shift-1) — shift 1 for reduce-scatter, 0 for
    all-gather."""
    out = []
    for s in range(p - 1):
        si, ri = (pos - s - shift) % p, (pos - s - shift - 1) % p
        out.append((b[si], b[si + 1], b[ri], b[ri + 1]))
    return out


def _nseg(b, p, segment_bytes, itemsize):
    """Pipeline segments per step, from the largest chunk (the same on every rank)."""
    return segments(max(b[i + 1] - b[i] for i in range(p)), segment_bytes // itemsize)


def _copy_segments(comm, nseg):
    """Segments of an all-gather step: a copy gains nothing from them in shared memory
    (one rendezvous per segment: 5-10% slower at 4-64 MiB on 2 ranks), but across a
    wire they keep flows that share it from stalling (``exchange``).  All ranks of
    ``comm`` ask together, with the same ``nseg``."""
    return nseg if nseg > 1 and spans_nodes(comm) else 1


def ring_reduce_scatter(comm, buf, reduce, bounds=None, order=None, segment_bytes=SEGMENT_BYTES):
    """In place on the 1-D ``buf``: afterwards ring position i holds chunk i reduced."""
    p = comm.size
    if p == 1:
        return buf
    b = chunk_bounds(buf.size, p) if bounds is None else bounds
    pos, right, left = _place(comm, order)
    nseg = _nseg(b, p, segment_bytes, buf.itemsize)
    for slo, shi, rlo, rhi in _steps(p, pos, b, 1):
        exchange_reduce(comm, buf[slo:shi], right, buf[rlo:rhi], left, reduce, nseg)
    return buf


def ring_all_gather(comm, buf, bounds=None, order=None, segment_bytes=SEGMENT_BYTES):
    """In place on the 1-D ``buf``: position i contributes chunk i, all end with all."""
    p = comm.size
    if p == 1:
        return buf
    b = chunk_bounds(buf.size, p) if bounds is None else bounds
    pos, right, left = _place(comm, order)
    nseg = _copy_segments(comm, _nseg(b, p, segment_bytes, buf.itemsize))
    for slo, shi, rlo, rhi in _steps(p, pos, b, 0):
        exchange(comm, buf[slo:shi], right, buf[rlo:rhi], left, nseg)
    return buf


def _plan(comm, n, itemsize, segment_bytes):
    """Everything ring_all_reduce needs for ``n`` elements, computed once per
    (communicator, n, itemsize, segment size) and cached: neighbours, segments per
    step and the slice bounds of every step.  Rank arithmetic only — no buffers."""
    key = ("ring", n, itemsize, segment_bytes)
    plan = comm.cache.get(key)
    if plan is None:
        p = comm.size
        b = chunk_bounds(n, p)
        pos, right, left = _place(comm, None)
        plan = comm.cache[key] = (right, left, _nseg(b, p, segment_bytes, itemsize),
                                  _steps(p, pos, b, 1), _steps(p, pos, b, 0))
    return plan


def ring_all_reduce(comm, buf, reduce, segment_bytes=SEGMENT_BYTES):
    """Ring all-reduce in place: reduce-scatter, then all-gather of the reduced chunks
    (the same steps as the two functions above, from a cached plan)."""
    if comm.size == 1:
        return buf
    right, left, nseg, rs_steps, ag_steps = _plan(comm, buf.size, buf.itemsize, segment_bytes)
    for slo, shi, rlo, rhi in rs_steps:
        exchange_reduce(comm, buf[slo:shi], right, buf[rlo:rhi], left, reduce, nseg)
    copy_nseg = _copy_segments(comm, nseg)
    for slo, shi, rlo, rhi in ag_steps:
        exchange(comm, buf[slo:shi], right, buf[rlo:rhi], left, copy_nseg)
    return buf
