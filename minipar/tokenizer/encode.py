"""Encoding chunks with learned merges: a compiled loop over a batch of chunks.

To encode one chunk, start from its bytes and repeat: among the adjacent pairs, find the
one with the lowest rank (the earliest merge); replace each of its occurrences, left to
right, by its token; stop when no adjacent pair is a merge.  Lowest rank first is the
order training applied them in, so encoding reproduces what training did to the chunk.

The merge table is two sorted arrays: ``keys[r] = a·2^16 + b`` of each merge and the
token it makes (``256 + rank``); a pair's rank is a binary search away.  A third array
gives the pair each token replaces.  Chunks are
short, so the quadratic scan per chunk is cheap; the loop is compiled with numba and
takes many chunks at once (bytes concatenated, with offsets) to pay Python's overhead once.
"""
from __future__ import annotations

import numba
import numpy as np

PAIR_BASE = 1 << 16          # token ids fit in 16 bits (shards store uint16)


def merge_table(merges):
    """(keys, tokens, pairs): the merges sorted by their pair key, for binary search,
    and ``pairs[t - 256] = (a, b)``, the pair that token t replaces."""
    pairs = np.array(merges, dtype=np.int64).reshape(len(merges), 2)
    keys = pairs[:, 0] * PAIR_BASE + pairs[:, 1]
    tokens = np.arange(256, 256 + len(merges), dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    return keys[order], tokens[order], pairs


@numba.njit(cache=True, nogil=True)
def _token_of(keys, tokens, a, b):
    """The token merging (a, b), or -1 (the lower the token, the earlier the merge)."""
    key = a * PAIR_BASE + b
    j = np.searchsorted(keys, key)
    if j < keys.size and keys[j] == key:
        return tokens[j]
    return -1


@numba.njit(cache=True, nogil=True)
def _encode_chunks(data, offsets, keys, tokens, pairs, out):
    """Encode the chunks ``data[offsets[c]:offsets[c+1]]``; writes their tokens into
    ``out`` one after another and returns the token offsets (len = chunks + 1)."""
    n_chunks = offsets.size - 1
    out_offsets = np.zeros(n_chunks + 1, dtype=np.int64)
    work = np.empty(max(1, np.max(offsets[1:] - offsets[:-1])) if n_chunks else 1, np.int64)
    pos = 0
    for c in range(n_chunks):
        n = offsets[c + 1] - offsets[c]
        for i in range(n):
            work[i] = data[offsets[c] + i]
        while n >= 2:
            best = -1
            for i in range(n - 1):
                t = _token_of(keys, tokens, work[i], work[i + 1])
                if t >= 0 and (best < 0 or t < best):
                    best = t
            if best < 0:
                break
            a, b = pairs[best - 256, 0], pairs[best - 256, 1]
            write, i = 0, 0
            while i < n:
                if i + 1 < n and work[i] == a and work[i + 1] == b:
                    work[write] = best
                    i += 2
                else:
                    work[write] = work[i]
                    i += 1
                write += 1
            n = write
        for i in range(n):
            out[pos + i] = work[i]
        pos += n
        out_offsets[c + 1] = pos
    return out_offsets


def encode_chunks(chunks, table):
    """[token array of each chunk] for a list of ``bytes`` chunks."""
    if not chunks:
        return []
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.int64)
    out = np.empty(max(int(offsets[-1]), 1), dtype=np.int64)
    out_offsets = _encode_chunks(data, offsets, *table, out)
    return [out[out_offsets[c]:out_offsets[c + 1]] for c in range(len(chunks))]
