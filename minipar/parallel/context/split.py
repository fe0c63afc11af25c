"""Which positions of a sequence each context-parallel rank holds.

The sequence of S positions is cut into 2C chunks of c = S/(2C).  Rank r holds two:

    zig-zag      chunks r and 2C-1-r      (balanced: work ∝ chunk index, the pair sums to 2C-1)
    contiguous   chunks 2r and 2r+1       (rank r holds positions [r·S/C, (r+1)·S/C))

Under the causal mask, query chunk a attends to key chunk b fully if b < a, on its
diagonal (half the pairs) if b == a, not at all if b > a.  In units of one full chunk
pair (``work_units``): contiguous rank r does (2r + ½) + (2r + 1 + ½) = 4r + 2 — from 2
on rank 0 to 4C - 2 on the last, whose time is the step's; zig-zag rank r does
(r + ½) + (2C - 1 - r + ½) = 2C on every rank, the mean of the contiguous split.
"""
from __future__ import annotations

import numpy as np


def check_context_parallel(seq_len, cp):
    """Raise ValueError unless ``seq_len`` splits into 2·cp equal chunks."""
    if cp < 1:
        raise ValueError(f"`cp` must be >= 1, got {cp}")
    if cp > 1 and seq_len % (2 * cp):
        raise ValueError(f"`seq_len` {seq_len} must be divisible by 2·cp = {2 * cp} (each of the "
                         f"cp ranks holds two chunks of the sequence); choose `seq_len` a "
                         f"multiple of {2 * cp}")


def chunks_of(rank, cp, zigzag=True):
    """The two chunk indices rank ``rank`` holds, in the order its tokens are laid out."""
    return (rank, 2 * cp - 1 - rank) if zigzag else (2 * rank, 2 * rank + 1)


def positions_of(rank, cp, seq_len, zigzag=True):
    """The sequence positions of this rank's tokens, in their local order."""
    c = seq_len // (2 * cp)
    return np.concatenate([np.arange(j * c, (j + 1) * c) for j in chunks_of(rank, cp, zigzag)])


def pair_kind(q_chunk, k_chunk):
    """How query chunk a sees key chunk b under the causal mask: full, diag or none."""
    return "full" if k_chunk < q_chunk else "diag" if k_chunk == q_chunk else "none"


def work_units(rank, cp, zigzag=True):
    """Chunk pairs rank ``rank`` computes (a diagonal pair counted as one half)."""
    mine = chunks_of(rank, cp, zigzag)
    units = 0.0
    for other in range(cp):
        for a in mine:
            for b in chunks_of(other, cp, zigzag):
                units += {"full": 1.0, "diag": 0.5, "none": 0.0}[pair_kind(a, b)]
    return units
