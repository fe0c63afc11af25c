"""Region boundaries of tensor parallelism as named autograd Functions (Megatron's f and g).

A tensor-parallel block alternates between *regions*: the replicated region (every tp rank
holds the same full activation), the tensor-parallel region (each rank holds a slice of the
hidden features: some heads, some MLP columns) and, with sequence parallelism, the sequence
region (each rank holds a slice of the tokens, all features).  Crossing a boundary is one
collective in forward and its *transpose* in backward:

    name                          forward                 backward
    copy_to_tp_region       (f)   identity                all-reduce
    reduce_from_tp_region   (g)   all-reduce              identity
    gather_from_sequence_region   all-gather (tokens)     reduce-scatter (tokens)
    reduce_scatter_to_sequence    reduce-scatter (tokens) all-gather (tokens)

Why: y = x·A with A = [A_1 … A_t] split by columns needs x on every rank (f), and its
backward dx = Σ_r dy_r·A_rᵀ sums over ranks (all-reduce).  z = Σ_r y_r·B_r with B split by
rows needs the sum (g); the sum's gradient is the same on every rank (identity).
With sequence parallelism the all-reduce g = reduce-scatter + all-gather is cut in two,
and the all-gather is postponed to the next f: same bytes, but LayerNorm and dropout in
between run on 1/t of the tokens.

Volume per rank (ring, S = b·s·h elements): all-reduce 2(t-1)/t·S, all-gather and
reduce-scatter (t-1)/t·S each, so one transformer block (2 f, 2 g) moves 8·S·(t-1)/t
elements in forward + backward, with or without sequence parallelism.

All-reduces use the ring algorithm (``ALGORITHM``): bit-identical results on every rank and
a message count that does not depend on a cost model (2(t-1) messages per all-reduce while
the buffer fits in one pipeline segment).  Inputs are never modified in place: an upstream
gradient array may be shared by several branches of the graph.
"""
from __future__ import annotations

import time

from minipar.backend import xp
from minipar.autograd.function import Function
from minipar.comm import all_gather, all_reduce, chunk_bounds, reduce_scatter

ALGORITHM = "ring"


# ---------------------------------------------------------------- array helpers (no autograd)
def _axis_first(x, axis):
    """x with ``axis`` moved to the front, contiguous, so a flat chunk is a slab of that axis."""
    return xp.ascontiguousarray(xp.moveaxis(x, axis, 0))


def split_along(comm, x, axis):
    """My part of ``x`` along ``axis`` (array_split rule: ``chunk_bounds(n, t)``)."""
    b = chunk_bounds(x.shape[axis], comm.size)
    index = [slice(None)] * x.ndim
    index[axis] = slice(b[comm.rank], b[comm.rank + 1])
    return xp.ascontiguousarray(x[tuple(index)])


def timed(comm, collective, *args, **kwargs):
    """Run a collective and add its seconds to ``comm.blocking_comm_s``: tensor-parallel
    communication blocks the computation, so this is time the training log counts as
    communication."""
    start = time.perf_counter()
    result = collective(comm, *args, **kwargs)
    comm.blocking_comm_s += time.perf_counter() - start
    return result


def gather_along(comm, x, axis):
    """Concatenate every rank's ``x`` along ``axis`` (rank order).  The parts are equal
    (sequence parallelism needs a sequence length divisible by t), so the sizes are
    known without a message."""
    if comm.size == 1:
        return x
    first = _axis_first(x, axis)
    full = timed(comm, all_gather, first, sizes=[first.size] * comm.size)
    full = full.reshape((first.shape[0] * comm.size,) + first.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(full, 0, axis))


def reduce_scatter_along(comm, x, axis):
    """Sum ``x`` over ranks and keep my part along ``axis`` (which must divide evenly)."""
    if comm.size == 1:
        return x
    n = x.shape[axis]
    if n % comm.size:
        raise ValueError(f"reduce-scatter along an axis of {n} over {comm.size} ranks: "
                         f"the length must be divisible by the tensor-parallel size")
    first = _axis_first(x, axis)
    shard = timed(comm, reduce_scatter, first, inplace=True).reshape((n // comm.size,) + first.shape[1:])
    return xp.ascontiguousarray(xp.moveaxis(shard, 0, axis))


def all_reduce_inplace(comm, x, op="sum"):
    """op over ranks into ``x`` itself (a buffer of our own); no message when t = 1."""
    if comm.size > 1:
        timed(comm, all_reduce, x, op=op, algorithm=ALGORITHM)
    return x


def all_reduce_copy(comm, x):
    """Σ_ranks x into a new array (``x`` untouched)."""
    if comm.size == 1:
        return x
    return timed(comm, all_reduce, x, algorithm=ALGORITHM, out=xp.empty_like(x))


# ---------------------------------------------------------------- the Functions
class CopyToTensorParallelRegion(Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce_copy(ctx.comm, g)


class ReduceFromTensorParallelRegion(Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm=None):
        return all_reduce_copy(comm, x)

    @staticmethod
    def backward(ctx, g):
        return g


class GatherFromSequenceRegion(Function):
    """All-gather along the sequence axis forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, comm=None, axis=1):
        ctx.comm, ctx.axis = comm, axis
        return gather_along(comm, x, axis)

    @staticmethod
    def backward(ctx, g):
        return reduce_scatter_along(ctx.comm, g, ctx.axis)


class ReduceScatterToSequenceRegion(Function):
    """Reduce-scatter along the sequence axis forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, comm=None, axis=1):
        ctx.comm, ctx.axis = comm, axis
        return reduce_scatter_along(comm, x, axis)

    @staticmethod
    def backward(ctx, g):
        return gather_along(ctx.comm, g, ctx.axis)


def copy_to_tp_region(x, comm):
    return CopyToTensorParallelRegion.apply(x, comm=comm)


def reduce_from_tp_region(x, comm):
    return ReduceFromTensorParallelRegion.apply(x, comm=comm)


def gather_from_sequence_region(x, comm, axis=1):
    return GatherFromSequenceRegion.apply(x, comm=comm, axis=axis)


def reduce_scatter_to_sequence_region(x, comm, axis=1):
    return ReduceScatterToSequenceRegion.apply(x, comm=comm, axis=axis)
