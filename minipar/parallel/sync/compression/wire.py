"""Bytes on the wire: what each collective a hook uses sends, per rank (the formulas).

The transport counts every byte it sends (``Communicator.bytes_sent``); these are the
textbook volumes the counts must equal, exactly, chunk sizes included:

    ring all-reduce of L elements     2(n-1)/n·L·b   — precisely, rank r sends every chunk
                                      but its own in the reduce-scatter and every chunk but
                                      chunk r+1 in the all-gather: b·(2L - c_r - c_(r+1))
    ring all-gather of shards of s    (n-1)·s·b      — every shard but the right neighbour's

with b bytes per element and c_i the array_split chunk sizes (``comm.chunk_sizes``).
The uncompressed baseline of a bucket is its ring all-reduce; a method's compression
ratio is that baseline divided by what it sends.
"""
from __future__ import annotations

from minipar.comm import chunk_sizes


def ring_all_reduce_bytes(numel, itemsize, n, rank):
    """Bytes rank ``rank`` of ``n`` sends in a ring all-reduce of ``numel`` elements."""
    if n == 1 or numel == 0:
        return 0
    c = chunk_sizes(numel, n)
    return itemsize * (2 * numel - c[rank] - c[(rank + 1) % n])


def all_gather_bytes(shard_numel, itemsize, n):
    """Bytes every rank sends in a ring all-gather of equal shards of ``shard_numel``."""
    return itemsize * (n - 1) * shard_numel
