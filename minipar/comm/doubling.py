"""Recursive doubling and Rabenseifner all-reduce, with the fold-in for non-powers of two.

Both work on p' = 2^⌊log2 p⌋ ranks.  With p' < p the first 2·(p-p') ranks pair up
(fold-in): each even one sends its whole buffer to its odd neighbour and sits out; the
odd one reduces and takes part under "new rank" r//2, the others under r-(p-p').  At
the end each odd rank sends the result back (fold-out).  Fold cost: 2α + 2S·β + S·γ.

- Recursive doubling: in step k (k = 0..log2 p'-1) rank i swaps its *whole* buffer with
  rank i XOR 2^k and reduces.  log2 p'·(α + S·β + S·γ): fewest messages, most bytes —
  the small-message algorithm.  Both partners compute the same sum, so both put the
  lower rank's operand first: op(lower, upper) — by induction every rank of a group of
  2^(k+1) then holds the same bits, even for NaN payloads and signed zeros (the new
  numbering keeps the order of the real ranks, so "lower" means the same in both).
- Rabenseifner: recursive *halving* reduce-scatter (swap half the current window with
  partner i XOR 2^k, from the highest bit down, keep and reduce the other half), then
  recursive doubling all-gather of the reduced blocks, in the reverse order.
  2·log2 p'·α + 2(p'-1)/p'·S·β + (p'-1)/p'·S·γ: ring's bandwidth with log-many steps.
"""
from __future__ import annotations

from minipar.comm.chunks import chunk_bounds, pow2_floor, segments
from minipar.comm.exchange import SEGMENT_BYTES, exchange, exchange_reduce
from minipar.comm.transport import COLL_TAG


def _fold_in(comm, buf, reduce):
    """Fold p ranks onto a power of two; returns (new rank or -1 if sitting out, rem)."""
    p, r = comm.size, comm.rank
    rem = p - pow2_floor(p)
    if r >= 2 * rem:
        return r - rem, rem
    if r % 2 == 0:
        comm.send(buf, r + 1, COLL_TAG)
        return -1, rem
    tmp = comm.workspace(buf.size, buf.dtype)
    comm.recv(tmp, r - 1, COLL_TAG)
    reduce(tmp, buf, out=buf)  # the lower rank's operand first, as everywhere here
    return r // 2, rem


def _fold_out(comm, buf, rem):
    r = comm.rank
    if r < 2 * rem:
        if r % 2 == 0:
            comm.recv(buf, r + 1, COLL_TAG)
        else:
            comm.send(buf, r - 1, COLL_TAG)


def _real(newrank, rem):
    """Communicator rank of a new (folded) rank."""
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def _layout(comm):
    """(p', rem, my new rank or -1, my partners in doubling order), cached per communicator.

    Pure rank arithmetic, the same for every call on ``comm``: computed once so the
    per-call Python work of a small all-reduce is just its messages and reductions.
    """
    lay = comm.cache.get("doubling")
    if lay is None:
        p2 = pow2_floor(comm.size)
        rem, r = comm.size - p2, comm.rank
        newrank = (r // 2 if r % 2 else -1) if r < 2 * rem else r - rem
        partners = () if newrank < 0 else tuple(
            _real(newrank ^ (1 << k), rem) for k in range(p2.bit_length() - 1))
        lay = comm.cache["doubling"] = (p2, rem, newrank, partners)
    return lay


def recursive_doubling_all_reduce(comm, buf, reduce, segment_bytes=SEGMENT_BYTES):
    """All-reduce in place by whole-buffer swaps with partners at distance 1, 2, 4, ..."""
    if comm.size == 1:
        return buf
    _, rem, _, partners = _layout(comm)
    if rem:
        _fold_in(comm, buf, reduce)
    nseg = segments(buf.size, segment_bytes // buf.itemsize) if buf.nbytes > segment_bytes else 1
    for partner in partners:  # empty for a rank that sits out
        exchange_reduce(comm, buf, partner, buf, partner, reduce, nseg,
                        theirs_first=partner < comm.rank)
    if rem:
        _fold_out(comm, buf, rem)
    return buf


def rabenseifner_all_reduce(comm, buf, reduce, segment_bytes=SEGMENT_BYTES):
    """All-reduce in place: recursive-halving reduce-scatter + recursive-doubling all-gather."""
    if comm.size == 1:
        return buf
    p2 = pow2_floor(comm.size)
    newrank, rem = _fold_in(comm, buf, reduce)
    if newrank >= 0:
        b = chunk_bounds(buf.size, p2)  # block i ends up reduced on new rank i
        seg = segment_bytes // buf.itemsize
        lo, hi, mask = 0, p2, p2 >> 1
        while mask:  # halving: the window of blocks I am responsible for halves each step
            partner = _real(newrank ^ mask, rem)
            mid = (lo + hi) // 2
            nseg = segments(max(b[mid] - b[lo], b[hi] - b[mid]), seg)
            if newrank & mask:
                exchange_reduce(comm, buf[b[lo]:b[mid]], partner, buf[b[mid]:b[hi]], partner,
                                reduce, nseg)
                lo = mid
            else:
                exchange_reduce(comm, buf[b[mid]:b[hi]], partner, buf[b[lo]:b[mid]], partner,
                                reduce, nseg)
                hi = mid
            mask >>= 1
        mask = 1
        while mask < p2:  # doubling: swap windows with the partner, the window doubles
            partner = _real(newrank ^ mask, rem)
            plo, phi = (lo - mask, lo) if newrank & mask else (hi, hi + mask)
            exchange(comm, buf[b[lo]:b[hi]], partner, buf[b[plo]:b[phi]], partner)
            lo, hi = min(lo, plo), max(hi, phi)
            mask <<= 1
    _fold_out(comm, buf, rem)
    return buf
