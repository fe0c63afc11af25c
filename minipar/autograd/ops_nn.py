"""Fused neural-network ops: softmax, log-softmax, layer norm, embedding,
cross-entropy and dropout.  Each is one Function with a hand-derived backward,
which is both faster and more numerically careful than composing primitives.

Half-precision inputs (fp16/bf16) get their statistics (max, sums, variance,
log-sum-exp) in float32, and results are rounded back: the mixed-precision rule.
"""
from __future__ import annotations

from minipar.backend import xp, backend_name, is_half, wide_dtype, widened
from minipar.autograd.function import Function
from minipar.autograd.ops_math import fused_kernels
from minipar.autograd.rows import column_dot, column_sums, for_row_blocks, row_dot, row_sum


class Softmax(Function):
    """y = exp(x - max) / Σ exp(x - max);  dx = y · (dy - Σ dy·y)."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        z = widened(x)
        e = xp.exp(z - z.max(axis=axis, keepdims=True))
        e /= e.sum(axis=axis, keepdims=True)
        y = e.astype(x.dtype)
        ctx.save_for_backward(y)
        ctx.axis = axis
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved
        return y * (g - (g * y).sum(axis=ctx.axis, keepdims=True)), None


class LogSoftmax(Function):
    """y = x - logsumexp(x);  dx = dy - softmax(x) · Σ dy."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        z = widened(x)
        m = z.max(axis=axis, keepdims=True)
        y = (z - (m + xp.log(xp.exp(z - m).sum(axis=axis, keepdims=True)))).astype(x.dtype)
        ctx.save_for_backward(y)
        ctx.axis = axis
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved
        return g - xp.exp(y) * g.sum(axis=ctx.axis, keepdims=True), None


def layernorm_param_grads(g2, xhat, dtype, needs=(True, True)):
    """LayerNorm's (dw, db) = (Σ dy·x̂, Σ dy) over the rows of dy (rows, d), summed in
    float32 or wider and cast to the weights' ``dtype``; None where ``needs`` (w, b) is
    False.  Sums over rows, so whole-array reductions; the fused kernels use it too."""
    wide = widened(g2)
    gw = column_dot(wide, xhat).astype(dtype, copy=False) if needs[0] else None
    gb = column_sums(wide).astype(dtype, copy=False) if needs[1] else None
    return gw, gb


class LayerNorm(Function):
    """y = (x - μ)/σ · w + b over the last axis, σ = sqrt(var + eps).

    With x̂ = (x - μ)/σ and ĝ = dy·w:  dx = (ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) / σ,
    dw = Σ dy·x̂,  db = Σ dy  (sums over every axis but the last).
    Each row is normalised on its own, so forward and dx run as row blocks on the
    rank's threads (``rows.py``); dw and db, sums over rows, stay whole-array sums.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        if fused := fused_kernels("layernorm", x, weight, bias):  # compiled: kernels/fused_*.py
            y, xhat, inv_sigma = fused.layernorm_forward(x, weight, bias, eps)
            ctx.save_for_backward(xhat, inv_sigma)
            return y
        d = x.shape[-1]
        x2 = x.reshape(-1, d)
        wide = wide_dtype(x2.dtype)
        y = xp.empty(x2.shape, dtype=x.dtype)
        xhat = xp.empty(x2.shape, dtype=wide)
        inv_sigma = xp.empty((x2.shape[0], 1), dtype=wide)

        def rows(lo, hi):
            z = widened(x2[lo:hi])
            c = xhat[lo:hi]
            mean = row_sum(z)
            mean /= d
            xp.subtract(z, mean, out=c)
            s = inv_sigma[lo:hi]
            var = row_dot(c, c)
            var /= d
            xp.add(var, eps, out=s)
            xp.sqrt(s, out=s)
            xp.divide(1.0, s, out=s)
            c *= s
            if y.dtype == wide:
                xp.multiply(c, weight, out=y[lo:hi])
                y[lo:hi] += bias
            else:
                y[lo:hi] = c * weight + bias

        for_row_blocks(x2.shape[0], rows, x2.size)
        ctx.save_for_backward(xhat, inv_sigma)   # weight: read from ctx.inputs (see Linear)
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        xhat, inv_sigma = ctx.saved
        w = ctx.input_value(1)
        if fused := fused_kernels("layernorm", g, w):
            return fused.layernorm_backward(g, xhat, inv_sigma, w, ctx.needs_input_grad[:3]) + (None,)
        nx = ctx.needs_input_grad[0]
        g2 = g.reshape(xhat.shape)
        d = xhat.shape[-1]
        gw, gb = layernorm_param_grads(g2, xhat, w.dtype, ctx.needs_input_grad[1:3])
        gx = None
        if nx:
            gx = xp.empty(g2.shape, dtype=g.dtype)

            def rows(lo, hi):
                gh = widened(g2[lo:hi]) * w
                xh = xhat[lo:hi]
                mean_gh = row_sum(gh)
                mean_gh /= d
                mean_ghx = row_dot(gh, xh)
                mean_ghx /= d
                gh -= mean_gh
                gh -= xh * mean_ghx
                gh *= inv_sigma[lo:hi]
                gx[lo:hi] = gh

            for_row_blocks(g2.shape[0], rows, g2.size)
            gx = gx.reshape(g.shape)
        return gx, gw, gb, None


class Embedding(Function):
    """y = W[ids].  Several positions may share an id, so dW is a scatter-add of dy."""

    @staticmethod
    def forward(ctx, weight, ids):
        ctx.ids, ctx.shape, ctx.dtype = ids, weight.shape, weight.dtype
        return weight[ids]

    @staticmethod
    def backward(ctx, g):
        ids, rows = ctx.ids.reshape(-1), g.reshape(-1, ctx.shape[1])
        if backend_name() != "numpy" and is_half(ctx.dtype):
            # CuPy has no bf16 atomics; fp32 ones sum more exactly too
            wide = xp.zeros(ctx.shape, dtype=xp.float32)
            xp.add.at(wide, ids, rows.astype(xp.float32))
            return wide.astype(ctx.dtype), None
        gw = xp.zeros(ctx.shape, dtype=ctx.dtype)
        if backend_name() != "numpy" or ids.size == 0:
            xp.add.at(gw, ids, rows)
            return gw, None
        # NumPy's add.at goes element by element (~3x slower here): sort the rows by
        # id instead, and sum each id's run of rows with one reduceat
        order = xp.argsort(ids, kind="stable")
        ids = ids[order]
        starts = xp.flatnonzero(xp.r_[True, ids[1:] != ids[:-1]])
        gw[ids[starts]] = xp.add.reduceat(rows[order], starts, axis=0)
        return gw, None


class CrossEntropy(Function):
    """Mean over counted rows of  logsumexp(z) - z[target]  (rows whose target is
    ``ignore_index`` count for nothing).  dz = (softmax(z) - onehot(target)) / count.
    """

    @staticmethod
    def forward(ctx, logits, targets, ignore_index=-100):
        z = widened(logits.reshape(-1, logits.shape[-1]))
        t = targets.reshape(-1)
        keep = t != ignore_index
        safe_t = xp.where(keep, t, 0)
        m = z.max(axis=-1, keepdims=True)
        e = xp.exp(z - m)
        sum_e = e.sum(axis=-1, keepdims=True)
        lse = (m + xp.log(sum_e))[:, 0]
        picked = z[xp.arange(z.shape[0]), safe_t]
        # on the device, in z's dtype (an int is exact there): int(keep.sum()) would make
        # every forward wait for the GPU
        count = xp.maximum(keep.sum(), 1).astype(z.dtype)
        loss = ((lse - picked) * keep).sum() / count
        ctx.save_for_backward(e, sum_e)
        ctx.args = (safe_t, keep, count, logits.shape, logits.dtype)
        return xp.asarray(loss, dtype=wide_dtype(logits.dtype))

    @staticmethod
    def backward(ctx, g):
        e, sum_e = ctx.saved
        safe_t, keep, count, shape, dtype = ctx.args
        grad = e / sum_e
        grad[xp.arange(grad.shape[0]), safe_t] -= 1
        grad *= (keep[:, None] * (g / count)).astype(grad.dtype)
        return grad.reshape(shape).astype(dtype), None, None


class Dropout(Function):
    """Zero each element with probability p and scale the rest by 1/(1-p), so the
    expectation is unchanged; the same mask gates the gradient.  The mask comes
    from the caller's generator, so recomputation can replay it exactly."""

    @staticmethod
    def forward(ctx, x, p, generator):
        keep = generator.random(x.shape) >= p
        scale = xp.asarray(1.0 / (1.0 - p), dtype=x.dtype)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * keep * scale

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved[0] * ctx.scale, None, None
