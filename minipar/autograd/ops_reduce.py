"""Reductions and products: sum, mean, max, matmul, and the fused linear layer.

Reductions copy the output gradient back across the reduced axes (sum), divide
it by the count (mean), or send it to the arg-max (max, split evenly on ties).
For C = A @ B:  dA = dC @ Bᵀ  and  dB = Aᵀ @ dC  (summed over broadcast batches).

Mixed precision (fp16/bf16 inputs) follows the tensor-core contract: products of
half inputs are accumulated in float32 and the result is rounded to half once
(``_mm``); sums of half arrays accumulate in float32 and ``Sum`` returns float32
(a loss or statistic built from half values is an fp32 number).  float32 and
float64 take the plain ``@`` / ``sum`` paths, untouched.
"""
from __future__ import annotations

from minipar.backend import xp, is_half, backend_name
from minipar.autograd.function import Function
from minipar.autograd.ops_math import unbroadcast
from minipar.autograd.rows import column_sums, matmul, side_by_side, side_by_side_pays


_half_gemm = {}  # backend name -> half_matmul(a, b, bias) (use_half_gemm)


def use_half_gemm(function, backend="cupy"):
    """Give ``_mm`` a backend's own half-precision GEMM: ``minipar.kernels.half_gemm``
    registers cuBLAS's for CuPy when imported (``import minipar.nn`` imports it).
    Autograd cannot import kernels, which are built on it.  None unregisters."""
    if function is None:
        _half_gemm.pop(backend, None)
    else:
        _half_gemm[backend] = function


def _mm(a, b, bias=None):
    """a @ b (+ bias).  Two half inputs: fp32 accumulation, one rounding to half.
    NumPy has no half-precision BLAS, so it computes in float32 and rounds (the same
    numbers a tensor core gives); on CuPy cuBLAS does it (``kernels/half_gemm.py``:
    CuPy's own batched half ``matmul`` casts to fp32 and skips the tensor cores)."""
    if not (is_half(a.dtype) and is_half(b.dtype)):
        y = matmul(a, b)
        if bias is not None:
            y += bias
        return y
    half = a.dtype
    if backend_name() == "cupy":
        gemm = _half_gemm.get("cupy")
        if gemm is not None and a.dtype == b.dtype and (bias is None or bias.dtype == half):
            return gemm(a, b, bias)
        y = a @ b
        return y if bias is None else y + bias
    y = matmul(a.astype(xp.float32), b.astype(xp.float32))
    if bias is not None:
        y += bias.astype(xp.float32)
    return y.astype(half)


def _sum_rows(g):
    """Σ over axis 0, accumulated in float32 (rounded back) for half g."""
    if is_half(g.dtype):
        return column_sums(g, xp.float32).astype(g.dtype)
    return column_sums(g)


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
        ctx.half = x.dtype if is_half(x.dtype) else None
        if ctx.half is not None:   # accumulate half values in fp32; the sum stays fp32
            return xp.asarray(x.sum(axis=axis, keepdims=keepdims, dtype=xp.float32))
        return xp.asarray(x.sum(axis=axis, keepdims=keepdims))

    @staticmethod
    def backward(ctx, g):
        shape, axis, keepdims = ctx.args
        g = xp.broadcast_to(_expand(g, shape, axis, keepdims), shape)
        return (g.copy() if ctx.half is None else g.astype(ctx.half)), None, None


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
        return _mm(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        na, nb = ctx.needs_input_grad
        ga = unbroadcast(_mm(g, xp.swapaxes(b, -1, -2)), a.shape) if na else None
        gb = unbroadcast(_mm(xp.swapaxes(a, -1, -2), g), b.shape) if nb else None
        return ga, gb


class Linear(Function):
    """y = x @ W + b with W of shape (in, out).

    Backward as two GEMMs on the flattened batch: dx = dy @ Wᵀ, dW = xᵀ @ dy,
    db = Σ dy.  When backward was given a ``WeightGradDeferral`` (zero-bubble pipeline,
    ``ctx.deferral``), dW and db are queued there instead of computed now.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        ctx.save_for_backward(x)   # the weight is read from the input Tensor in backward,
        # so ZeRO-3 can free it after forward and gather it again before backward
        rows = x.reshape(-1, x.shape[-1])           # one big GEMM, not one per batch entry
        return _mm(rows, weight, bias).reshape(x.shape[:-1] + (weight.shape[1],))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved
        w = ctx.input_value(1)
        nx, nw = ctx.needs_input_grad[:2]
        nb = len(ctx.needs_input_grad) > 2 and ctx.needs_input_grad[2]
        x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
        deferral = getattr(ctx, "deferral", None)
        if (nx and nw and deferral is None and not (is_half(g.dtype) or is_half(w.dtype))
                and side_by_side_pays(g2, w.T)):        # dX here, dW and db on the worker
            gx, (gw, gb) = side_by_side(lambda: g2 @ w.T,
                                        lambda: (x2.T @ g2, _sum_rows(g2) if nb else None))
            return gx.reshape(x.shape), gw, gb
        gx = _mm(g2, w.T).reshape(x.shape) if nx else None

        def weight_grads():
            return (_mm(x2.T, g2) if nw else None), (_sum_rows(g2) if nb else None)

        if deferral is not None and (nw or nb):
            deferral.defer(ctx.inputs[1:], weight_grads)
            return gx, None, None
        gw, gb = weight_grads()
        return gx, gw, gb
