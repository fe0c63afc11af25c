"""The public collectives: check the arguments, pick an algorithm, run it on the p2p layer.

    all_reduce(comm, array, op="sum", algorithm="auto", out=None) -> out or array
    reduce_scatter(comm, array, op="sum", out=None, inplace=False) -> my shard (1-D)
    all_gather(comm, shard, sizes=None, out=None) -> full (1-D)
    broadcast(comm, array, root=0, algorithm="auto") -> array
    reduce(comm, array, root=0, op="sum", out=None, algorithm="auto") -> result on root, None elsewhere
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

import numpy  # host metadata (all_gather's counts) only

from minipar.backend import xp
from minipar.comm import checks, cost_model, watchdog
from minipar.comm.agree import check, gather_rows
from minipar.comm.algorithms import (_ALL_REDUCE, ALL_REDUCE_ALGORITHMS, _algorithm,  # noqa: F401
                                     _auto, _hierarchical, _params)
from minipar.comm.chunks import bounds_from_sizes, chunk_bounds, flat, ufunc
from minipar.comm.ring import ring_all_gather, ring_reduce_scatter
from minipar.comm.transport import COLL_TAG, CollectiveArgumentError
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
