"""The public collectives: check the arguments, pick an algorithm, run it on the p2p layer.

    all_reduce(comm, array, op="sum", algorithm="auto", out=None) -> out or array
    reduce_scatter(comm, array, op="sum", out=None, inplace=False) -> my shard (1-D)
    all_gather(comm, shard, sizes=None, out=None) -> full (1-D)
    broadcast(comm, array, root=0, algorithm="auto") -> array
    reduce(comm, array, root=0, op="sum", out=None, algorithm="auto") -> result on root, None elsewhere
    all_to_all(comm, send, counts, out=None, algorithm="auto") -> (received, recv_counts)
    barrier(comm)

``comm`` is a :class:`~minipar.comm.transport.Transport` (users hold its subclass
``communicator.Communicator``).  Arrays may have any shape; collectives that split a
buffer see it flattened (C order) and split it with the ``array_split`` rule of
``chunks.py`` (rank r owns chunk r).  ``op`` is "sum", "max" or "min"; any dtype the
array library can add (float16/32/64, ints) works, since the bytes travel untyped and the
reduction is ``xp.add / maximum / minimum``.

In place vs out of place: ``all_reduce`` and ``broadcast`` work in place unless ``out``
is given (then ``array`` is left untouched).  ``reduce_scatter`` leaves ``array`` intact
unless ``inplace=True`` (then ``array`` is scratch and the shard is a view into it, if
``array`` is contiguous).  Buffers and ``out`` may be non-contiguous and of any shape:
the collective works on a contiguous copy and writes the result through the strides.

Promises:

- **Arguments are checked before the first message** (``checks.py``); in check mode
  every rank also agrees on them first, so a bad argument or a disagreement on any rank
  raises the same error on every rank, never a hang (``agree.py``).
- **Replicas are bit-identical.**  After all_reduce (every algorithm), reduce_scatter +
  all_gather and broadcast, every rank holds the same bits, for every value: signed
  zeros, NaNs with any sign or payload, infinities.  Each output element is either
  computed on one rank and copied to the others (ring, Rabenseifner, tree,
  hierarchical), or — recursive doubling — computed by both partners of a swap with the
  operands in the same order (the lower rank's first).  Not promised: the same bits as
  a different algorithm, rank count or NumPy's ``sum`` (the order of additions differs,
  so floats differ by rounding).
"""
from __future__ import annotations

import math

import numpy  # host metadata (all_gather's counts) only

from minipar.backend import xp
from minipar.comm import checks, cost_model, watchdog
from minipar.comm.agree import check, gather_rows
from minipar.comm.algorithms import (_ALL_REDUCE, ALL_REDUCE_ALGORITHMS, _algorithm,  # noqa: F401
                                     _auto, _hierarchical, _params)
from minipar.comm.alltoall import ALL_TO_ALL
from minipar.comm.alltoall import choose as choose_all_to_all
from minipar.comm.chunks import bounds_from_sizes, chunk_bounds, flat, ufunc
from minipar.comm.ring import ring_all_gather, ring_reduce_scatter
from minipar.comm.transport import COLL_TAG, CollectiveArgumentError, CollectiveMismatchError
from minipar.comm.tree import (binomial_broadcast, binomial_reduce, ring_reduce,
                               scatter_allgather_broadcast)


def _work_on(array, out):
    """(target, contiguous 1-D view to compute on, write-back needed?)."""
    target = array if out is None else out
    if out is not None and out is not array:
        out[...] = array
    buf = flat(target)
    if buf is None:
        return target, xp.ascontiguousarray(target).reshape(-1), True
    return target, buf, False


def _in_place(array, out):
    """Check the array the result is written into: ``out``, or ``array`` itself."""
    if out is not None and out is not array:
        return checks.same_as(out, array)
    return checks.writeable(array, "array", "the result is written into it in place")


def all_reduce(comm, array, op="sum", algorithm="auto", out=None):
    """Every rank ends with op(array over all ranks); in place unless ``out`` is given."""
    ctx = comm.context("coll")

    def local():
        reduce, name = ufunc(op), _algorithm(algorithm)
        _in_place(checks.reducible(array, op), out)
        # what the ranks must agree on (built only in check mode, the one that sends it)
        fields = ctx.check and dict(count=array.size, dtype=array.dtype.name, op=op, algorithm=name)
        return fields, array.size, -1, (reduce, name)

    (reduce, name), _ = check(ctx, "all_reduce", local)
    target, buf, copy_back = _work_on(array, out)
    if ctx.size > 1 and buf.size:
        name = _auto(ctx, buf.nbytes) if name == "auto" else name
        with watchdog.doing(ctx, f"all_reduce ({name})"):
            if ":" in name:
                _hierarchical(ctx, buf, reduce, name.split(":", 1)[1])
            else:
                _ALL_REDUCE[name](ctx, buf, reduce)
    if copy_back:
        target[...] = buf.reshape(target.shape)
    return target


def reduce_scatter(comm, array, op="sum", out=None, inplace=False):
    """Reduce ``array`` over ranks and return chunk ``rank`` of the result (1-D, ring).

    Chunks follow ``chunk_bounds(array.size, size)``; ``out`` (if given: exactly the
    chunk's element count and ``array``'s dtype, any shape or strides) receives the shard.
    """
    ctx = comm.context("coll")

    def local():
        reduce = ufunc(op)
        checks.reducible(array, op)
        b = chunk_bounds(array.size, ctx.size)
        if out is not None:
            checks.holds(out, b[ctx.rank + 1] - b[ctx.rank], array.dtype)
        if inplace:
            checks.writeable(array, "array", "inplace=True uses it as scratch")
        fields = ctx.check and dict(count=array.size, dtype=array.dtype.name, op=op)
        return fields, array.size, -1, (reduce, b)

    (reduce, b), _ = check(ctx, "reduce_scatter", local)
    buf = flat(array) if inplace else None
    if buf is None:
        buf = xp.array(array, copy=True).reshape(-1)
    with watchdog.doing(ctx, "reduce_scatter (ring)"):
        ring_reduce_scatter(ctx, buf, reduce, b)
    shard = buf[b[ctx.rank]:b[ctx.rank + 1]]
    if out is not None:
        out[...] = shard.reshape(out.shape)  # through out's strides, never into a copy
        return out
    return shard


def _gathered_sizes(ctx, shard, out, counts):
    """all_gather without ``sizes``: every rank's count (exchanged now unless check mode
    already did), with every rank's ``out`` size checked against their sum — by every
    rank alike, so a wrong ``out`` anywhere raises everywhere."""
    if counts is None:
        mine = numpy.array([shard.size, -1 if out is None else out.size], dtype=numpy.int64)
        with watchdog.doing(ctx, "all_gather (sizes)"):
            counts = gather_rows(ctx, mine) if ctx.size > 1 else mine.reshape(1, 2)
    sizes = [int(c) for c in counts[:, 0]]
    total = sum(sizes)
    bad = [(q, int(n)) for q, n in enumerate(counts[:, 1]) if n not in (-1, total)]
    if bad:
        raise CollectiveArgumentError("\n".join(
            f"rank {q}: all_gather: out has {n} elements; the result has {total} "
            f"(shards of {sizes})" for q, n in bad))
    return sizes


def all_gather(comm, shard, sizes=None, out=None):
    """Concatenate every rank's ``shard`` (flattened) in rank order, on every rank (ring).

    ``sizes[r]`` is rank r's element count; without it the counts are exchanged first
    (one extra tiny all-gather, which also checks every rank's ``out``; in check mode the
    agreement carries them).  ``out`` (``sum(sizes)`` elements of the shard's dtype, any
    shape; 1-D by default) may already hold my shard in place.
    """
    ctx = comm.context("coll")

    def local():
        checks.movable(shard, "shard")
        known = None if sizes is None else checks.sizes(sizes, ctx.size, ctx.rank, shard.size)
        if out is not None:
            checks.holds(out, sum(known) if known is not None else out.size, shard.dtype)
        fields = ctx.check and dict(dtype=shard.dtype.name,
                                    sizes="exchanged" if known is None else tuple(known))
        return fields, shard.size, -1 if out is None else out.size, known

    known, counts = check(ctx, "all_gather", local)
    if known is None:
        known = _gathered_sizes(ctx, shard, out, counts)
    b = bounds_from_sizes(known)
    if out is None:
        out = xp.empty(b[-1], dtype=shard.dtype)
    full = flat(out)
    strided = full is None
    if strided:  # gather into a contiguous buffer, write through out's strides at the end
        full = xp.empty(b[-1], dtype=shard.dtype)
    full[b[ctx.rank]:b[ctx.rank + 1]] = shard.reshape(-1)
    with watchdog.doing(ctx, "all_gather (ring)"):
        ring_all_gather(ctx, full, b)
    if strided:
        out[...] = full.reshape(out.shape)
    return out


BROADCAST_ALGORITHMS = ("auto", "binomial", "scatter_allgather")
REDUCE_ALGORITHMS = ("auto", "binomial", "ring")


def broadcast(comm, array, root=0, algorithm="auto"):
    """Copy root's ``array`` into every rank's ``array`` (in place).

    ``binomial`` (⌈log2 p⌉ rounds of the whole buffer) for small buffers,
    ``scatter_allgather`` (binomial scatter + ring all-gather) for large; ``auto`` asks
    the cost model.
    """
    ctx = comm.context("coll")

    def local():
        checks.movable(array)
        rt = checks.root(root, ctx.size)
        checks.choice(algorithm, BROADCAST_ALGORITHMS, "broadcast algorithm")
        if ctx.rank != rt:
            checks.writeable(array, "array", "the broadcast writes into it")
        fields = ctx.check and dict(count=array.size, dtype=array.dtype.name, root=rt,
                                    algorithm=algorithm)
        return fields, array.size, -1, rt

    rt, _ = check(ctx, "broadcast", local)
    target, buf, copy_back = _work_on(array, None)
    name = algorithm
    if ctx.size > 1 and buf.size:
        if name == "auto":
            c = _params(ctx)
            name = min(("binomial", "scatter_allgather"),
                       key=lambda a: cost_model.predict_broadcast(a, ctx.size, buf.nbytes, c))
        with watchdog.doing(ctx, f"broadcast ({name})"):
            (binomial_broadcast if name == "binomial" else scatter_allgather_broadcast)(ctx, buf, rt)
    if copy_back and ctx.rank != rt:
        target[...] = buf.reshape(target.shape)
    return target


def reduce(comm, array, root=0, op="sum", out=None, algorithm="auto"):
    """op(array over ranks) on ``root`` (into ``out`` or ``array``); None on other ranks,
    whose ``array`` (and ``out``) are left untouched.  ``binomial`` tree or ``ring``
    (reduce-scatter + gather) — ``auto`` compares the cost model's binomial reduce (about
    half a tree all-reduce) with the ring's reduce-scatter + gather (about a ring
    all-reduce).  ``out``, if given, must match ``array`` on every rank."""
    ctx = comm.context("coll")

    def local():
        red = ufunc(op)
        checks.reducible(array, op)
        rt = checks.root(root, ctx.size)
        checks.choice(algorithm, REDUCE_ALGORITHMS, "reduce algorithm")
        if ctx.rank == rt:
            _in_place(array, out)
        elif out is not None:
            checks.same_as(out, array)
        fields = ctx.check and dict(count=array.size, dtype=array.dtype.name, root=rt, op=op,
                                    algorithm=algorithm)
        return fields, array.size, -1, (red, rt)

    (red, rt), _ = check(ctx, "reduce", local)
    if ctx.rank == rt:
        target, buf, copy_back = _work_on(array, out)
    else:
        target, buf, copy_back = None, xp.array(array, copy=True).reshape(-1), False
    name = algorithm
    if ctx.size > 1 and buf.size:
        if name == "auto":
            c = _params(ctx)
            name = "ring" if (cost_model.predict("ring", ctx.size, buf.nbytes, c) <
                              cost_model.predict("tree", ctx.size, buf.nbytes, c) / 2) \
                else "binomial"
        with watchdog.doing(ctx, f"reduce ({name})"):
            (binomial_reduce if name == "binomial" else ring_reduce)(ctx, buf, red, rt)
    if copy_back:
        target[...] = buf.reshape(target.shape)
    return target


ALL_TO_ALL_ALGORITHMS = tuple(ALL_TO_ALL)            # and "auto", the cost model's choice


def _exchanged_counts(ctx, counts, row_bytes, out_rows):
    """Every rank's counts, as the matrix M[s][d] (rows s sends d; a list of lists), exchanged in one
    all-gather of p+2 integers per rank: [row bytes, out rows (-1: none), counts...].

    All-gathered rather than all-to-all'd (each rank would learn only its column): in
    ⌈log2 p⌉ rounds instead of p-1, with 8·p·(p+2) bytes per rank — small at the sizes a
    group is (33 KiB at p = 64) — and with the whole matrix every rank checks every
    rank's row size and ``out`` alike, so a disagreement or a wrong ``out`` raises the
    same error on every rank, before any row moves; the two-level exchange needs the
    counts of its node's other ranks too.  Metadata: the traffic counters skip it."""
    mine = numpy.array([row_bytes, out_rows, *counts], dtype=numpy.int64)
    if ctx.size > 1:
        with watchdog.doing(ctx, "all_to_all (counts)"):
            rows = gather_rows(ctx, mine).tolist()
    else:
        rows = [mine.tolist()]
    if any(row[0] != rows[0][0] for row in rows):
        groups = {}
        for q, row in enumerate(rows):
            groups.setdefault(row[0], []).append(str(q))
        raise CollectiveMismatchError(
            "all_to_all: ranks disagree on the row size (width x itemsize):\n" + "\n".join(
                f"  ranks {','.join(qs)}: {n} bytes" for n, qs in groups.items()))
    matrix = [row[2:] for row in rows]
    if any(row[1] >= 0 for row in rows):
        receives = [sum(column) for column in zip(*matrix)]
        bad = [(q, row[1]) for q, row in enumerate(rows) if row[1] not in (-1, receives[q])]
        if bad:
            raise CollectiveArgumentError("\n".join(
                f"rank {q}: all_to_all: out has {n} rows; the rank receives {receives[q]} "
                f"({[row[q] for row in matrix]} from ranks 0..{ctx.size - 1})" for q, n in bad))
    return matrix


def all_to_all(comm, send, counts, out=None, algorithm="auto"):
    """All-to-all-v: rows grouped by destination in, rows grouped by source out.

    ``send`` is a (rows, width) array of any dtype (1-D: width 1; more axes: each row is
    ``send[i]``) whose first ``counts[0]`` rows go to rank 0, the next ``counts[1]`` to
    rank 1, ...; ``counts`` holds one non-negative integer per rank (0 is fine, uneven
    always).  Returns ``(received, recv_counts)``: the rows received, those of rank 0
    first, then rank 1's, ... (in ``out`` if given: exactly that many rows, shaped and
    typed like ``send``'s rows, any strides), and ``recv_counts[s]``, the rows from rank s.

    The counts go first (every rank learns the whole matrix, ``_exchanged_counts``), then
    the rows (``alltoall.py``): ``pairwise`` (p-1 rounds of the linear shift),
    ``two_level`` (inside nodes, then across them), or ``auto`` — pairwise on one node,
    the cost model's cheaper across nodes.  Rank r sends, with ``pairwise``,

        Σ_{d≠r} counts[d] · width · itemsize  bytes

    (its own rows are a local copy); ``two_level`` sends rows bound for another column
    twice (inside its node, then across), each byte crossing the slow link once.
    """
    ctx = comm.context("coll")

    def local():
        checks.movable(checks.rows_of(send), "send")
        mine = checks.counts(counts, ctx.size, send.shape[0])
        checks.choice(algorithm, ("auto",) + ALL_TO_ALL_ALGORITHMS, "all-to-all algorithm")
        if out is not None:
            checks.rows_like(out, send)
        width = math.prod(send.shape[1:])
        fields = ctx.check and dict(dtype=send.dtype.name, width=width, algorithm=algorithm)
        return fields, send.shape[0], -1 if out is None else out.shape[0], (mine, width)

    (mine, width), _ = check(ctx, "all_to_all", local)
    matrix = _exchanged_counts(ctx, mine, width * send.itemsize,
                               -1 if out is None else out.shape[0])
    recv_counts = [row[ctx.rank] for row in matrix]
    shape = (sum(recv_counts),) + send.shape[1:]
    if out is None:
        out = xp.empty(shape, dtype=send.dtype)
    rows_out = flat(out)
    strided = rows_out is None
    rows_out = (xp.empty(shape, dtype=send.dtype) if strided else out).reshape(shape[0], width)
    rows_in = xp.ascontiguousarray(send).reshape(send.shape[0], width)
    name = algorithm
    if name == "auto":
        name = choose_all_to_all(ctx, matrix, width * send.itemsize, _params(ctx))
    with watchdog.doing(ctx, f"all_to_all ({name})"):
        ALL_TO_ALL[name](ctx, rows_in, matrix, rows_out)
    if strided:
        out[...] = rows_out.reshape(shape)
    return out, recv_counts


def barrier(comm):
    """Dissemination barrier: in round k rank r signals r+2^k and waits for r-2^k;
    after ⌈log2 p⌉ rounds everyone has (transitively) heard from everyone."""
    ctx = comm.context("coll")
    check(ctx, "barrier", lambda: ({}, 0, -1, None))
    p, r = ctx.size, ctx.rank
    token, sink = xp.empty(0, dtype=xp.uint8), xp.empty(0, dtype=xp.uint8)
    dist = 1
    with watchdog.doing(ctx, "barrier"):
        while dist < p:
            ctx.sendrecv(token, (r + dist) % p, sink, (r - dist) % p, COLL_TAG)
            dist <<= 1
