"""Local argument checks, made by every collective before its first message.

A collective that fails half-way leaves its peers waiting for messages that never come,
so everything a rank can know on its own is checked before it sends anything:

- the buffers are arrays of a dtype the collective can move: reductions need numbers
  (ints, floats, complex, registered numeric types such as bfloat16; bool only for
  max/min, which are OR/AND — a bool "sum" would not be NumPy's count); the copying
  collectives take any fixed-size dtype, never ``object`` (its bytes are pointers);
- ``out`` has the element count (and, for all_reduce/reduce, the shape) the result
  needs and exactly the input's dtype — nothing is cast, truncated or broadcast — and is
  writeable; it may be non-contiguous (the result is written through its strides);
- ``root`` is an integer in [0, size): no wrap-around of negatives (-1 is
  ``MPI_PROC_NULL`` to MPICH: the data would silently go nowhere);
- all_to_all's ``counts`` are one non-negative integer per rank that add up to the send
  buffer's rows, and its ``out`` holds rows like the send buffer's (how many, only the
  counts exchange can tell: ``collectives._exchanged_counts`` checks that on every rank).

Each check raises ``ValueError``/``TypeError`` with what is wrong and what was expected;
the collective turns it into :class:`CollectiveArgumentError` — on every rank in check
mode (``agree.py``).
"""
from __future__ import annotations

import operator


def array(x, what="array"):
    """``x`` must be an array (has shape, dtype, flags)."""
    try:
        x.shape, x.dtype, x.flags, x.size
    except AttributeError:
        raise TypeError(f"{what} must be an array, not {type(x).__name__}") from None
    return x


def reducible(x, op, what="array"):
    """``x`` is an array of numbers that ``op`` can reduce exactly as NumPy would."""
    dt = array(x, what).dtype
    if dt.kind in "iufc":
        return x
    if dt.kind == "b" and op in ("max", "min"):
        return x
    if dt.kind == "V" and dt.fields is None and dt.isbuiltin == 2:  # e.g. ml_dtypes' bfloat16
        return x
    hint = " (use max/min for any/all, or cast to an integer type to count)" if dt.kind == "b" else ""
    raise TypeError(f"{what} has dtype {dt}, which {op!r} cannot reduce; a reduction needs "
                    f"numbers (int, float, complex){hint}")


def movable(x, what="array"):
    """``x`` is an array whose bytes are its values (no Python objects inside)."""
    dt = array(x, what).dtype
    if dt.hasobject:
        raise TypeError(f"{what} has dtype {dt}: its bytes are pointers to Python objects, "
                        "which cannot be sent; use a numeric or fixed-size dtype")
    return x


def writeable(x, what="out", why="the result is written into it"):
    # a CuPy array's flags have no ``writeable``: device arrays are always writeable
    if not getattr(x.flags, "writeable", True):
        raise ValueError(f"{what} is read-only ({why})")
    return x


def same_as(out, x, what="out", of="array"):
    """``out`` has exactly ``x``'s shape and dtype and can be written."""
    array(out, what)
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"{what} has shape {out.shape} and dtype {out.dtype}; it must match "
                         f"{of}: shape {x.shape}, dtype {x.dtype}")
    return writeable(out, what)


def holds(out, count, dtype, what="out"):
    """``out`` has exactly ``count`` elements of ``dtype`` (any shape) and can be written."""
    array(out, what)
    if out.size != count:
        raise ValueError(f"{what} has {out.size} elements (shape {out.shape}); the result "
                         f"has {count}")
    if out.dtype != dtype:
        raise ValueError(f"{what} has dtype {out.dtype}; the result is {dtype} (nothing is "
                         "cast: pass an out of the input's dtype)")
    return writeable(out, what)


def root(value, size):
    """``value`` as a rank in [0, size)."""
    try:
        r = operator.index(value)
    except TypeError:
        raise TypeError(f"root must be an integer rank, not {value!r}") from None
    if not 0 <= r < size:
        raise ValueError(f"root={r} is not a rank of this {size}-rank communicator "
                         f"(valid: 0..{size - 1})")
    return r


def sizes(values, size, rank, mine):
    """all_gather's ``sizes``: ``size`` non-negative integers, ``sizes[rank] == mine``."""
    try:
        out = [operator.index(s) for s in values]
    except TypeError:
        raise TypeError(f"sizes must be integers, not {values!r}") from None
    if len(out) != size:
        raise ValueError(f"sizes has {len(out)} entries for a {size}-rank communicator")
    if min(out, default=0) < 0:
        raise ValueError(f"sizes has a negative entry: {out}")
    if out[rank] != mine:
        raise ValueError(f"the shard has {mine} elements but sizes[{rank}] = {out[rank]}")
    return out


def counts(values, size, rows):
    """all_to_all's ``counts``: ``size`` non-negative integers (rows for each rank) that
    add up to the ``rows`` of the send buffer; returned as a list of ints."""
    try:
        out = [operator.index(c) for c in values]
    except TypeError:
        raise TypeError(f"counts must be {size} integers (rows for each rank), not "
                        f"{values!r}") from None
    if len(out) != size:
        raise ValueError(f"counts has {len(out)} entries for a {size}-rank communicator "
                         "(one per destination rank)")
    if min(out, default=0) < 0:
        raise ValueError(f"counts has a negative entry: {out}")
    if sum(out) != rows:
        raise ValueError(f"counts add up to {sum(out)} rows but send has {rows}")
    return out


def rows_of(x, what="send"):
    """``x`` has rows (axis 0): at least one dimension."""
    if array(x, what).ndim == 0:
        raise ValueError(f"{what} is 0-d; it needs rows (axis 0), grouped by destination")
    return x


def rows_like(out, send, what="out"):
    """``out`` holds rows like ``send``'s (the same shape after axis 0, the same dtype) and
    can be written; how many rows it needs is known only once the counts are exchanged."""
    array(out, what)
    if out.ndim != send.ndim or out.shape[1:] != send.shape[1:] or out.dtype != send.dtype:
        tail = ", ".join(map(str, send.shape[1:]))
        rows = f"(rows, {tail})" if tail else "(rows,)"
        raise ValueError(f"{what} has shape {out.shape} and dtype {out.dtype}; it must hold rows "
                         f"like send's: shape {rows} and dtype {send.dtype}")
    return writeable(out, what)


def choice(name, options, what):
    if name not in options:
        raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(options)}")
    return name
