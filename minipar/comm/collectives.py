"""The public collectives: pick an algorithm, check the arguments, run it on the p2p layer.

    all_reduce(comm, array, op="sum", algorithm="auto", out=None) -> out or array
    reduce_scatter(comm, array, op="sum", out=None, inplace=False) -> my shard (1-D)
    all_gather(comm, shard, sizes=None, out=None) -> full (1-D)
    broadcast(comm, array, root=0, algorithm="auto") -> array
    reduce(comm, array, root=0, op="sum", out=None, algorithm="auto") -> result on root, None elsewhere
    barrier(comm)

``comm`` is a :class:`~minipar.comm.transport.Communicator`.  Arrays may have any shape;
collectives that split a buffer see it flattened (C order) and split it with the
``array_split`` rule of ``chunks.py`` (rank r owns chunk r).  ``op`` is "sum", "max" or
"min"; any dtype the array library can add (float16/32/64, ints) works, since the bytes
travel untyped and the reduction is ``xp.add / maximum / minimum``.

In place vs out of place: ``all_reduce`` and ``broadcast`` work in place unless ``out``
is given (then ``array`` is left untouched).  ``reduce_scatter`` leaves ``array`` intact
unless ``inplace=True`` (then ``array`` is scratch and the shard is a view into it).
Every algorithm leaves the result bit-identical on all ranks.
"""
from __future__ import annotations

from minipar.backend import xp
from minipar.comm import cost_model
from minipar.comm.chunks import bounds_from_sizes, chunk_bounds, flat, ufunc
from minipar.comm.doubling import rabenseifner_all_reduce, recursive_doubling_all_reduce
from minipar.comm.hierarchical import hierarchical_all_reduce, node_layout
from minipar.comm.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from minipar.comm.transport import COLL_TAG
from minipar.comm.tree import (binomial_broadcast, binomial_reduce, ring_reduce,
                               scatter_allgather_broadcast, tree_all_reduce)

ALIASES = {"rd": "recursive_doubling", "rab": "rabenseifner", "binomial": "tree"}


def _hierarchical(comm, buf, reduce, inner_algorithm="auto"):
    """Two levels; the inter-node all-reduce uses ``inner_algorithm`` ("hierarchical:ring")."""
    def inner(cross, shard):
        name = _auto(cross, shard.nbytes) if inner_algorithm == "auto" else inner_algorithm
        _ALL_REDUCE[name](cross, shard, reduce)
    return hierarchical_all_reduce(comm, buf, reduce, inner)


_ALL_REDUCE = {
    "ring": ring_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce,
    "rabenseifner": rabenseifner_all_reduce,
    "tree": tree_all_reduce,
    "hierarchical": _hierarchical,
}
ALL_REDUCE_ALGORITHMS = tuple(_ALL_REDUCE)


def _auto(comm, nbytes):
    """The cost model's choice for this communicator and size (cached per size)."""
    key = ("auto", nbytes)
    choice = comm.cache.get(key)
    if choice is None:
        candidates = ("ring", "recursive_doubling", "rabenseifner", "tree")
        if comm.ranks_per_node:  # only a declared node layout makes two levels worth it
            if 1 < node_layout(comm)[3] < comm.size:
                candidates += ("hierarchical",)
        choice = cost_model.choose(comm.size, nbytes, cost_model.params(comm), candidates)
        comm.cache[key] = choice
    return choice


def _algorithm(name):
    name = ALIASES.get(name, name)
    if name.startswith("hierarchical:"):
        inner = _algorithm(name.split(":", 1)[1])
        if inner == "hierarchical" or ":" in inner:
            raise ValueError("hierarchical:X needs a flat inner algorithm X")
        return name
    if name != "auto" and name not in _ALL_REDUCE:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose auto, one of "
                         f"{', '.join(_ALL_REDUCE)}, or hierarchical:<inner algorithm>")
    return name


def _work_on(array, out):
    """(target, contiguous 1-D view to compute on, write-back needed?)."""
    target = array if out is None else out
    if out is not None and out is not array:
        if out.shape != array.shape or out.dtype != array.dtype:
            raise ValueError(f"out has shape {out.shape} {out.dtype}, input {array.shape} {array.dtype}")
        out[...] = array
    buf = flat(target)
    if buf is None:
        return target, xp.ascontiguousarray(target).reshape(-1), True
    return target, buf, False


def all_reduce(comm, array, op="sum", algorithm="auto", out=None):
    """Every rank ends with op(array over all ranks); in place unless ``out`` is given."""
    ctx = comm.context("coll")
    reduce = ufunc(op)
    if algorithm not in _ALL_REDUCE and algorithm != "auto":
        algorithm = _algorithm(algorithm)
    target, buf, copy_back = _work_on(array, out)
    if ctx.check:
        ctx.check_agree("all_reduce", count=buf.size, dtype=buf.dtype, op=op, algorithm=algorithm)
    if ctx.size > 1 and buf.size:
        name = _auto(ctx, buf.nbytes) if algorithm == "auto" else algorithm
        if ":" in name:
            _hierarchical(ctx, buf, reduce, name.split(":", 1)[1])
        else:
            _ALL_REDUCE[name](ctx, buf, reduce)
    if copy_back:
        target[...] = buf.reshape(target.shape)
    return target


def reduce_scatter(comm, array, op="sum", out=None, inplace=False):
    """Reduce ``array`` over ranks and return chunk ``rank`` of the result (1-D, ring).

    Chunks follow ``chunk_bounds(array.size, size)``; ``out`` (if given) receives the shard.
    """
    ctx = comm.context("coll")
    reduce = ufunc(op)
    buf = flat(array) if inplace else None
    if buf is None:
        buf = xp.array(array, copy=True).reshape(-1)
    if ctx.check:
        ctx.check_agree("reduce_scatter", count=buf.size, dtype=buf.dtype, op=op)
    b = chunk_bounds(buf.size, ctx.size)
    ring_reduce_scatter(ctx, buf, reduce, b)
    shard = buf[b[ctx.rank]:b[ctx.rank + 1]]
    if out is not None:
        out.reshape(-1)[...] = shard
        return out
    return shard


def all_gather(comm, shard, sizes=None, out=None):
    """Concatenate every rank's ``shard`` (flattened) in rank order, on every rank (ring).

    ``sizes[r]`` is rank r's element count; without it the counts are exchanged first
    (one extra tiny all-gather).  ``out`` (1-D, ``sum(sizes)``) may already hold my shard
    in place.
    """
    ctx = comm.context("coll")
    mine = shard.reshape(-1)
    if sizes is None:
        counts = xp.zeros(ctx.size, dtype=xp.int64)
        counts[ctx.rank] = mine.size
        ring_all_gather(ctx, counts)
        sizes = [int(s) for s in (counts.get() if hasattr(counts, "get") else counts)]
    sizes = [int(s) for s in sizes]
    if ctx.check:
        ok = len(sizes) == ctx.size and sizes[ctx.rank] == mine.size
        ctx.check_agree("all_gather", dtype=mine.dtype, sizes=tuple(sizes),
                        shard="matches sizes" if ok else f"has {mine.size} elements (not sizes[rank])")
    b = bounds_from_sizes(sizes)
    if out is None:
        out = xp.empty(b[-1], dtype=mine.dtype)
    full = flat(out)
    full[b[ctx.rank]:b[ctx.rank + 1]] = mine
    ring_all_gather(ctx, full, b)
    return out


def broadcast(comm, array, root=0, algorithm="auto"):
    """Copy root's ``array`` into every rank's ``array`` (in place).

    ``binomial`` (⌈log2 p⌉ rounds of the whole buffer) for small buffers,
    ``scatter_allgather`` (binomial scatter + ring all-gather) for large; ``auto`` asks
    the cost model.
    """
    ctx = comm.context("coll")
    target, buf, copy_back = _work_on(array, None)
    if ctx.check:
        ctx.check_agree("broadcast", count=buf.size, dtype=buf.dtype, root=root, algorithm=algorithm)
    if ctx.size > 1 and buf.size:
        if algorithm == "auto":
            c = cost_model.params(ctx)
            algorithm = min(("binomial", "scatter_allgather"),
                            key=lambda a: cost_model.predict_broadcast(a, ctx.size, buf.nbytes, c))
        if algorithm == "binomial":
            binomial_broadcast(ctx, buf, root)
        elif algorithm == "scatter_allgather":
            scatter_allgather_broadcast(ctx, buf, root)
        else:
            raise ValueError(f"unknown broadcast algorithm {algorithm!r}")
    if copy_back:
        target[...] = buf.reshape(target.shape)
    return target


def reduce(comm, array, root=0, op="sum", out=None, algorithm="auto"):
    """op(array over ranks) on ``root`` (into ``out`` or ``array``); None on other ranks,
    whose ``array`` is left untouched.  ``binomial`` tree or ``ring`` (reduce-scatter +
    gather) — ``auto`` compares the cost model's binomial reduce (about half a tree
    all-reduce) with the ring's reduce-scatter + gather (about a ring all-reduce)."""
    ctx = comm.context("coll")
    red = ufunc(op)
    if ctx.rank == root:
        target, buf, copy_back = _work_on(array, out)
    else:
        target, buf, copy_back = None, xp.array(array, copy=True).reshape(-1), False
    if ctx.check:
        ctx.check_agree("reduce", count=buf.size, dtype=buf.dtype, root=root, op=op, algorithm=algorithm)
    if ctx.size > 1 and buf.size:
        if algorithm == "auto":
            c = cost_model.params(ctx)
            algorithm = "ring" if (cost_model.predict("ring", ctx.size, buf.nbytes, c) <
                                   cost_model.predict("tree", ctx.size, buf.nbytes, c) / 2) \
                else "binomial"
        if algorithm == "binomial":
            binomial_reduce(ctx, buf, red, root)
        elif algorithm == "ring":
            ring_reduce(ctx, buf, red, root)
        else:
            raise ValueError(f"unknown reduce algorithm {algorithm!r}")
    if copy_back:
        target[...] = buf.reshape(target.shape)
    return target


def barrier(comm):
    """Dissemination barrier: in round k rank r signals r+2^k and waits for r-2^k;
    after ⌈log2 p⌉ rounds everyone has (transitively) heard from everyone."""
    ctx = comm.context("coll")
    p, r = ctx.size, ctx.rank
    token, sink = xp.empty(0, dtype=xp.uint8), xp.empty(0, dtype=xp.uint8)
    dist = 1
    while dist < p:
        ctx.sendrecv(token, (r + dist) % p, sink, (r - dist) % p, COLL_TAG)
        dist <<= 1
