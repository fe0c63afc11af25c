"""Chunking and reduction helpers shared by every collective algorithm.

Chunking rule (used by reduce_scatter, all_gather and every ring/halving algorithm):
a buffer of ``n`` elements split over ``p`` parts uses ``numpy.array_split``
boundaries — the first ``n mod p`` chunks get ``ceil(n/p)`` elements, the rest
``floor(n/p)``:

    bounds(n, p)[i] = i·floor(n/p) + min(i, n mod p),   chunk i = [bounds[i], bounds[i+1])

so chunk sizes differ by at most one element, chunks may be empty when ``n < p``, and
rank ``r`` of a reduce-scatter owns chunk ``r``.

The reductions are the ufuncs of the selected array library: ``sum -> add``,
``max -> maximum``, ``min -> minimum``.  They are commutative in value but *not in
bits*: ``add`` of two NaNs keeps one operand's sign and payload, ``maximum(-0.0, 0.0)``
returns one of the two zeros, each by operand order.  So wherever two ranks compute the
same element they must use the same order (recursive doubling: the lower rank's operand
first, see ``exchange.py``); that is what keeps replicas bit-identical.
"""
from __future__ import annotations

from functools import lru_cache

from minipar.backend import backend_name, xp

OPS = {"sum": "add", "max": "maximum", "min": "minimum"}
_UFUNCS = {}


def ufunc(op: str):
    """The in-place-capable ufunc for a reduction name ("sum", "max", "min")."""
    key = (op, backend_name())
    f = _UFUNCS.get(key)
    if f is None:
        if op not in OPS:
            raise ValueError(f"unknown reduction op {op!r}; choose one of {', '.join(OPS)}")
        f = _UFUNCS[key] = getattr(xp, OPS[op])
    return f


@lru_cache(maxsize=1024)
def chunk_bounds(n: int, p: int) -> tuple:
    """Offsets of the ``p`` array_split chunks of ``n`` elements (length ``p + 1``)."""
    q, r = divmod(int(n), int(p))
    return tuple(i * q + min(i, r) for i in range(p + 1))


def chunk_sizes(n: int, p: int) -> list[int]:
    """Element counts of the ``p`` array_split chunks of ``n`` elements."""
    q, r = divmod(int(n), int(p))
    return [q + (1 if i < r else 0) for i in range(p)]


def bounds_from_sizes(sizes) -> list[int]:
    out = [0]
    for s in sizes:
        out.append(out[-1] + int(s))
    return out


def segments(n: int, segment_elems: int) -> int:
    """How many pipeline segments a message of ``n`` elements is cut into (at least 1)."""
    return max(1, -(-int(n) // max(1, int(segment_elems))))


def flat(array):
    """A 1-D view of a contiguous array (or None if it is not contiguous)."""
    if array.flags.c_contiguous:
        return array.reshape(-1)
    return None


def pow2_floor(p: int) -> int:
    """Largest power of two <= p (p >= 1)."""
    return 1 << (int(p).bit_length() - 1)
