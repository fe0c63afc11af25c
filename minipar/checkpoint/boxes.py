"""Boxes: rectangular slices of a global tensor, and the two operations a reshard needs.

A *box* is ``(offsets, lengths)``: the elements ``offsets[d] <= i_d < offsets[d] +
lengths[d]`` of a global tensor (``A[o0:o0+l0, o1:o1+l1]``).  A checkpoint records every
piece a rank wrote as a box; a rank that loads asks for the boxes it owns.  Reading is

    for every saved piece P of the tensor:      what I need  ∩  what P holds
        I = intersect(need, P.box)              per axis: [max(lo), min(hi))
        if I: out[I - need.offsets] = P[I - P.offsets]

so no rank ever assembles a tensor it does not own.  ZeRO shards are ranges of a
*flattened* tensor, not boxes: ``flat_to_boxes`` cuts such a range into the few boxes
(a partial first row, whole rows, a partial last row, recursively) it covers.
"""
from __future__ import annotations

import math


def intersect(a, b):
    """The box both ``a`` and ``b`` cover, or None: per axis [max(lo), min(hi))."""
    (oa, la), (ob, lb) = a, b
    lo = tuple(max(x, y) for x, y in zip(oa, ob))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(oa, la, ob, lb))
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return lo, tuple(h - l for l, h in zip(lo, hi))


def relative(box, origin):
    """``box`` as a tuple of slices into the array that holds box ``origin``."""
    (o, n), (p, _) = box, origin
    return tuple(slice(a - b, a - b + m) for a, m, b in zip(o, n, p))


def size(box):
    return math.prod(box[1])


def flat_to_boxes(shape, lo, hi):
    """Elements [lo, hi) of ``A.reshape(-1)`` (row-major ``shape``) as boxes, in order:
    concatenating each box's values flattened gives the range.  2-D example, 4 columns,
    [2, 13): row 0 cols 2-3, rows 1-2 whole, row 3 col 0."""
    if lo >= hi:
        return []
    if len(shape) <= 1:
        return [((lo,), (hi - lo,))]
    row = math.prod(shape[1:])
    (r0, c0), (r1, c1) = divmod(lo, row), divmod(hi, row)
    inner = lambda r, a, b: [((r,) + o, (1,) + n) for o, n in flat_to_boxes(shape[1:], a, b)]  # noqa: E731
    if r0 == r1:                                   # inside one row
        return inner(r0, c0, c1)
    out = []
    if c0:                                         # the rest of a started row
        out += inner(r0, c0, row)
        r0 += 1
    if r1 > r0:                                    # whole rows
        out.append(((r0,) + (0,) * (len(shape) - 1), (r1 - r0,) + tuple(shape[1:])))
    if c1:                                         # the start of the last row
        out += inner(r1, 0, c1)
    return out
