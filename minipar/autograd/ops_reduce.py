"""Reductions and products: sum, mean, max, matmul, and the fused linear layer.

Reductions copy the output gradient back across the reduced axes (sum), divide
it by the count (mean), or send it to the arg-max (max, split evenly on ties).
For C = A @ B:  dA = dC @ Bᵀ  and  dB = Aᵀ @ dC  (summed over broadcast batches).
"""
from __future__ import annotations

from minipar.backend import xp
from minipar.autograd.function import Function
from minipar.autograd.ops_math import unbroadcast


def _expand(g, in_shape, axis, keepdims):
    """Re-insert reduced axes into g so it broadcasts against the input."""
    if axis is None:
        return g.reshape((1,) * len(in_shape)) if not keepdims else g
    if not keepdims:
        axes = (axis,) if isinstance(axis, int) else axis
        axes = sorted(a % len(in_shape) for a in axes)
        for a in axes:
            g = xp.expand_dims(g, a)
    return g


class Sum(Function):
    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.args = (x.shape, axis, keepdims)
        return xp.asarray(x.sum(axis=axis, keepdims=keepdims))

    @staticmethod
    def backward(ctx, g):
        shape, axis, keepdims = ctx.args
        return xp.broadcast_to(_expand(g, shape, axis, keepdims), shape).copy(), None, None


class Max(Function):
    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        y = x.max(axis=axis, keepdims=True)
        ctx.save_for_backward(x == y)
        ctx.args = (x.shape, axis, keepdims)
        return xp.asarray(y if keepdims else (y.reshape(()) if axis is None else y.squeeze(axis)))

    @staticmethod
    def backward(ctx, g):
        (is_max,) = ctx.saved
        shape, axis, keepdims = ctx.args
        share = is_max / is_max.sum(axis=axis, keepdims=True)
        return _expand(g, shape, axis, keepdims) * share.astype(g.dtype), None, None


class MatMul(Function):
    """Batched a @ b for arrays of two or more dimensions (batch axes broadcast)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        na, nb = ctx.needs_input_grad
        ga = unbroadcast(g @ xp.swapaxes(b, -1, -2), a.shape) if na else None
        gb = unbroadcast(xp.swapaxes(a, -1, -2) @ g, b.shape) if nb else None
        return ga, gb


class Linear(Function):
    """y = x @ W + b with W of shape (in, out).

    Backward as two GEMMs on the flattened batch: dx = dy @ Wᵀ, dW = xᵀ @ dy,
    db = Σ dy.  When a ``WeightGradDeferral`` is active (zero-bubble pipeline),
    dW and db are queued for later instead of computed now.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        ctx.save_for_backward(x, weight)
        y = x @ weight
        if bias is not None:
            y += bias
        return y

    @staticmethod
    def backward(ctx, g):
        from minipar.autograd.deferral import active_deferral

        x, w = ctx.saved
        nx, nw = ctx.needs_input_grad[:2]
        nb = len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2]
        gx = g @ w.T if nx else None

        def weight_grads():
            x2 = x.reshape(-1, x.shape[-1])
            g2 = g.reshape(-1, g.shape[-1])
            return (x2.T @ g2 if nw else None), (g2.sum(axis=0) if nb else None)

        deferral = active_deferral()
        if deferral is not None and (nw or nb):
            deferral.defer(ctx.inputs[1:], weight_grads)
            return gx, None, None
        gw, gb = weight_grads()
        return gx, gw, gb
