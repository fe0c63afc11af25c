"""Elementwise ops: arithmetic with broadcasting, pow, exp, log, tanh, relu, gelu, silu, where, cast.

Broadcasting in the forward means summation in the backward: if ``a`` of shape
(3, 1) was stretched to (3, 4), each of its entries fed 4 outputs, so its
gradient is the output gradient summed over that axis (``unbroadcast``).
"""
from __future__ import annotations

import math

from minipar.backend import xp, is_half, backend_name, widened
from minipar.autograd.function import Function
from minipar.autograd.rows import for_row_blocks


def unbroadcast(grad, shape):
    """Sum ``grad`` down to ``shape``, undoing NumPy broadcasting (half grads are
    summed in float32 and rounded back, the mixed-precision rule for reductions)."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, n in enumerate(shape) if n == 1 and grad.shape[i + extra] != 1)
    if axes and is_half(grad.dtype):
        return grad.sum(axis=axes, keepdims=True, dtype=xp.float32).astype(grad.dtype).reshape(shape)
    summed = grad.sum(axis=axes, keepdims=True) if axes else grad
    return summed.reshape(shape)


def _shape(x):
    return getattr(x, "shape", ())


_fused = {}  # backend name -> the compiled versions of the fused ops (use_fused_kernels)


def use_fused_kernels(module, backend="cupy"):
    """Give the fused ops compiled kernels for one backend: ``minipar.kernels.fused_cuda``
    registers itself for CuPy, ``minipar.kernels.fused_cpu`` (numba) for NumPy, when
    imported.  A module names the ops it provides in ``OPS`` ("layernorm", "gelu",
    "attention_softmax", "adamw") and says which arrays it takes in ``supports``.
    Autograd cannot import them (kernels build on autograd); None unregisters."""
    if module is None:
        _fused.pop(backend, None)
    else:
        _fused[backend] = module


def fused_kernels(op, *arrays):
    """The kernels registered for the current backend when they provide ``op`` and take
    these arrays (their ``supports``: dtypes, size), else None: then the op's array code
    runs."""
    module = _fused.get(backend_name())
    if module is None or op not in module.OPS:
        return None
    return module if module.supports(*(a.dtype for a in arrays), elements=arrays[0].size) else None


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (_shape(a), _shape(b))
        return a + b

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g, sa) if na else None), (unbroadcast(g, sb) if nb else None)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (_shape(a), _shape(b))
        return a - b

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g, sa) if na else None), (unbroadcast(-g, sb) if nb else None)


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a * b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g * b, _shape(a)) if na else None,
                unbroadcast(g * a, _shape(b)) if nb else None)


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a / b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved
        na, nb = ctx.needs_input_grad
        return (unbroadcast(g / b, _shape(a)) if na else None,
                unbroadcast(-g * a / (b * b), _shape(b)) if nb else None)


class Neg(Function):
    @staticmethod
    def forward(ctx, a):
        return -a

    @staticmethod
    def backward(ctx, g):
        return -g


class Pow(Function):
    """x ** p for a constant exponent p:  d/dx = p · x^(p-1)."""

    @staticmethod
    def forward(ctx, x, p):
        ctx.save_for_backward(x)
        ctx.p = p
        return x ** p

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved
        return g * ctx.p * x ** (ctx.p - 1), None


class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        y = xp.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved[0]


class Log(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return xp.log(x)

    @staticmethod
    def backward(ctx, g):
        return g / ctx.saved[0]


class Tanh(Function):
    @staticmethod
    def forward(ctx, x):
        y = xp.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y = ctx.saved[0]
        return g * (1 - y * y)


class Relu(Function):
    @staticmethod
    def forward(ctx, x):
        mask = x > 0
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved[0]


_GELU_C = math.sqrt(2.0 / math.pi)


class Gelu(Function):
    """GPT-2's tanh GELU: 0.5·x·(1 + tanh(c·(x + 0.044715·x³))), c = sqrt(2/π).

    With t = tanh(u):  d/dx = 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3·0.044715·x²).
    Written with in-place updates of one or two scratch arrays: an activation this
    size is memory-bound, so each pass saved is time saved.  Element by element, so
    the flat array runs as blocks on the rank's threads (``rows.py``)."""

    @staticmethod
    def forward(ctx, x):
        if fused := fused_kernels("gelu", x):             # one compiled kernel: kernels/fused_*.py
            y, t = fused.gelu_forward(x)
            ctx.save_for_backward(x, t)
            return y
        flat = x.reshape(-1)
        t, y = xp.empty_like(flat), xp.empty_like(flat)

        def block(lo, hi):
            xb, tb, yb = flat[lo:hi], t[lo:hi], y[lo:hi]
            xp.multiply(xb, xb, out=tb)
            tb *= 0.044715 * _GELU_C
            tb += _GELU_C
            tb *= xb                     # u = c·(x + 0.044715·x³)
            xp.tanh(tb, out=tb)
            xp.add(tb, 1.0, out=yb)
            yb *= xb
            yb *= 0.5

        for_row_blocks(flat.size, block, flat.size)
        ctx.save_for_backward(x, t.reshape(x.shape))
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, g):
        x, t = ctx.saved
        if fused := fused_kernels("gelu", x, t, g):
            return fused.gelu_backward(x, t, g)
        xf, tf, gf = x.reshape(-1), t.reshape(-1), g.reshape(-1)
        d = xp.empty(xf.shape, dtype=x.dtype)

        def block(lo, hi):
            xb, tb, db = xf[lo:hi], tf[lo:hi], d[lo:hi]
            xp.multiply(xb, xb, out=db)
            db *= 3 * 0.044715 * _GELU_C
            db += _GELU_C                # c·(1 + 3·0.044715·x²)
            db *= 1.0 - tb * tb
            db *= xb
            db += 1.0 + tb
            db *= 0.5
            db *= gf[lo:hi]

        for_row_blocks(xf.size, block, xf.size)
        return d.reshape(g.shape)


class Silu(Function):
    """SiLU (swish): y = x·σ(x), σ(x) = 1/(1 + e^-x) = (1 + tanh(x/2))/2 — the tanh form
    never overflows and is one fast pass (as GELU's; where σ is below ~1e-13 it is good
    to ~1e-16 absolute, not relative).  dy/dx = σ·(1 + x·(1 - σ)).  Half-precision
    inputs are computed in float32 and rounded back."""

    @staticmethod
    def forward(ctx, x):
        wide = widened(x)
        sigma = xp.tanh(wide * 0.5)
        sigma += 1.0
        sigma *= 0.5
        ctx.save_for_backward(x, sigma)
        return (wide * sigma).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        x, sigma = ctx.saved
        d = 1.0 - sigma
        d *= x
        d += 1.0
        d *= sigma
        d *= g
        return d.astype(g.dtype, copy=False)


class Where(Function):
    """where(cond, a, b): the gradient goes to a where cond holds, to b elsewhere."""

    @staticmethod
    def forward(ctx, cond, a, b):
        ctx.cond = cond
        ctx.shapes = (_shape(a), _shape(b))
        return xp.where(cond, a, b)

    @staticmethod
    def backward(ctx, g):
        _, na, nb = ctx.needs_input_grad
        zero = xp.zeros((), dtype=g.dtype)
        ga = unbroadcast(xp.where(ctx.cond, g, zero), ctx.shapes[0]) if na else None
        gb = unbroadcast(xp.where(ctx.cond, zero, g), ctx.shapes[1]) if nb else None
        return None, ga, gb


class Cast(Function):
    """Change dtype; the gradient is cast back to the input's dtype."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.in_dtype = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, g):
        return g.astype(ctx.in_dtype), None
