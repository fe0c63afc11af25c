"""Binomial trees: reduce, broadcast, scatter — and what is built from them.

Ranks are renumbered relative to the root, v = (r - root) mod p.  In a binomial tree
node v's parent is v minus its lowest set bit, so a message reaches all p ranks in
⌈log2 p⌉ rounds (the set of informed ranks doubles each round).

- binomial broadcast / reduce: ⌈log2 p⌉·(α + S·β) (+ ⌈log2 p⌉·S·γ for reduce) —
  latency-optimal, but the root's links carry the whole buffer log p times.
- tree all-reduce = binomial reduce to rank 0 + binomial broadcast:
  2⌈log2 p⌉·(α + S·β) + ⌈log2 p⌉·S·γ.
- large broadcast (van de Geijn) = binomial *scatter* (v gets chunk v) + ring
  all-gather: (⌈log2 p⌉ + p - 1)·α + 2(p-1)/p·S·β — bandwidth-optimal.
- large reduce = ring reduce-scatter in root-relative order + every rank sends its
  reduced chunk to the root: 2(p-1)·α + 2(p-1)/p·S·β + (p-1)/p·S·γ.
"""
from __future__ import annotations

from minipar.comm.chunks import chunk_bounds
from minipar.comm.ring import ring_all_gather, ring_reduce_scatter
from minipar.comm.transport import COLL_TAG


def binomial_reduce(comm, buf, reduce, root=0):
    """Reduce into ``buf`` on ``root``; other ranks' ``buf`` are used as scratch."""
    p = comm.size
    v = (comm.rank - root) % p
    tmp = None
    mask = 1
    while mask < p:
        if v & mask:  # hand my partial result to the parent and stop
            comm.send(buf, (v - mask + root) % p, COLL_TAG)
            return buf
        if v + mask < p:
            if tmp is None:
                tmp = comm.workspace(buf.size, buf.dtype)
            comm.recv(tmp, (v + mask + root) % p, COLL_TAG)
            reduce(buf, tmp, out=buf)
        mask <<= 1
    return buf


def binomial_broadcast(comm, buf, root=0):
    """Copy ``buf`` of ``root`` to every rank in ⌈log2 p⌉ rounds."""
    p = comm.size
    v = (comm.rank - root) % p
    mask = 1
    while mask < p:
        if v & mask:
            comm.recv(buf, (v - mask + root) % p, COLL_TAG)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < p:
            comm.send(buf, (v + mask + root) % p, COLL_TAG)
        mask >>= 1
    return buf


def binomial_scatter(comm, buf, bounds, root=0):
    """Root holds chunks 0..p-1 (chunk v for relative rank v); each rank ends with its own
    (inner tree nodes also pass through their subtree's chunks)."""
    p = comm.size
    v = (comm.rank - root) % p
    mask = 1
    while mask < p:
        if v & mask:  # my subtree is v .. v+mask-1
            comm.recv(buf[bounds[v]:bounds[min(v + mask, p)]], (v - mask + root) % p, COLL_TAG)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < p:
            comm.send(buf[bounds[v + mask]:bounds[min(v + 2 * mask, p)]],
                      (v + mask + root) % p, COLL_TAG)
        mask >>= 1
    return buf


def tree_all_reduce(comm, buf, reduce):
    """All-reduce in place: binomial reduce to rank 0, then binomial broadcast."""
    if comm.size > 1:
        binomial_reduce(comm, buf, reduce, 0)
        binomial_broadcast(comm, buf, 0)
    return buf


def _relative_order(p, root):
    return [(root + i) % p for i in range(p)]


def scatter_allgather_broadcast(comm, buf, root=0):
    """Large-message broadcast: binomial scatter of p chunks, then ring all-gather."""
    p = comm.size
    if p > 1:
        b = chunk_bounds(buf.size, p)
        binomial_scatter(comm, buf, b, root)
        ring_all_gather(comm, buf, b, order=_relative_order(p, root))
    return buf


def ring_reduce(comm, buf, reduce, root=0):
    """Large-message reduce: ring reduce-scatter, then gather the chunks on ``root``."""
    p = comm.size
    if p == 1:
        return buf
    b = chunk_bounds(buf.size, p)
    ring_reduce_scatter(comm, buf, reduce, b, order=_relative_order(p, root))
    v = (comm.rank - root) % p
    if v:
        comm.send(buf[b[v]:b[v + 1]], root, COLL_TAG)
    else:
        reqs = [comm.irecv(buf[b[u]:b[u + 1]], (u + root) % p, COLL_TAG) for u in range(1, p)]
        comm.waitall(reqs)
    return buf
