"""Shape ops: reshape, transpose, indexing, concat.  They move values, never change them,
so each backward moves the gradient back to where the value came from."""
from __future__ import annotations

from minipar.backend import xp
from minipar.autograd.function import Function


class Reshape(Function):
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.in_shape), None


class Transpose(Function):
    """Permute axes (reverse them when ``axes`` is None); backward applies the inverse."""

    @staticmethod
    def forward(ctx, x, axes):
        axes = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
        ctx.axes = axes
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, g):
        inverse = [0] * len(ctx.axes)
        for i, a in enumerate(ctx.axes):
            inverse[a] = i
        return g.transpose(inverse), None


def _is_basic(index):
    """True for indices made of ints, slices, None and Ellipsis (no element repeats)."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, (int, slice)) or p is None or p is Ellipsis for p in parts)


class GetItem(Function):
    """x[index]. Basic slices write the gradient back in place; fancy indices
    may pick an element twice, so their gradients are scatter-added."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.in_shape, ctx.in_dtype, ctx.index = x.shape, x.dtype, index
        return x[index]

    @staticmethod
    def backward(ctx, g):
        grad = xp.zeros(ctx.in_shape, dtype=ctx.in_dtype)
        if _is_basic(ctx.index):
            grad[ctx.index] = g
        else:
            xp.add.at(grad, ctx.index, g)
        return grad, None

    @staticmethod
    def backward_into(ctx, g, into):
        """The backward the engine calls: g added into ``into``, the input's gradient so
        far (an array the engine owns), or, with None, placed in a new zero array."""
        if into is None:
            return GetItem.backward(ctx, g)[0]
        if _is_basic(ctx.index):
            into[ctx.index] += g
        else:
            xp.add.at(into, ctx.index, g)
        return into


class Concat(Function):
    """concat(t1, t2, ..., axis): the gradient is split at the same boundaries."""

    @staticmethod
    def forward(ctx, *arrays, axis=0):
        ctx.axis = axis
        ctx.bounds = [0]
        for a in arrays:
            ctx.bounds.append(ctx.bounds[-1] + a.shape[axis])
        return xp.concatenate(arrays, axis=axis)

    @staticmethod
    def backward(ctx, g):
        grads = []
        for lo, hi in zip(ctx.bounds[:-1], ctx.bounds[1:]):
            index = [slice(None)] * g.ndim
            index[ctx.axis] = slice(lo, hi)
            grads.append(g[tuple(index)])
        return tuple(grads)
