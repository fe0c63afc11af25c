"""The fused elementwise ops compiled for the CPU (numba): one pass over memory per op.

NumPy runs an op one whole-array ufunc at a time, so LayerNorm's forward reads and
writes its (rows, d) activation seven times (mean, x - μ, the variance, σ, x̂, ·w, +b)
and pays a call's fixed cost for each.  Measured here, float32 (2048, 128): 480 µs for
the NumPy op on 2 threads, against PyTorch's 94 µs.  Compiled, the loop reads x for the
row statistics and once more to write x̂ and y (``cpu_loops.py``: 98 µs on one thread,
the time of copying the array):

    for each row r:   μ = Σ x / d,   v = Σ (x - μ)² / d,   s = 1 / sqrt(v + eps)
    for each row r:   x̂ = (x - μ)·s,   y = x̂·w + b

The same goes for the tanh GELU and the causal attention softmax (the masked keys are
never touched).  The formulas, saved tensors and contract are those of the CUDA
versions (``fused_cuda.py``), so the autograd ops call either the same way:

    layernorm_forward(x, w, b, eps)      -> y, x̂, inv_sigma (rows, 1)
    layernorm_backward(dy, x̂, inv_sigma, w, needs) -> dx, dw = Σ dy·x̂, db = Σ dy
    gelu_forward(x) -> y, t = tanh(u);    gelu_backward(x, t, dy) -> dx
    attention_softmax_forward(S, scale, causal) -> P;  attention_softmax_backward(P, dP, scale) -> dS

and AdamW's update in one pass (``adamw_update``, called by ``optim``; CUDA has it too) and,
CPU only, the float64 Σ g² of the gradient norm (``sum_of_squares``, ``parallel/norm.py``);
the llama block's RMSNorm, rotary embedding and SwiGLU are ``fused_cpu_llama.py``'s,
re-exported here.
Each kernel works on a range of rows, ``kernel(lo, hi, ...)``, and releases the GIL
(``nogil``), so ``rows.for_row_blocks`` runs the blocks on the rank's own thread pool:
one thread budget for all of minipar, and a row's result does not depend on the number
of threads.

When this runs (``supports``): the NumPy backend, float32 or float64, numba installed,
and at least ``MIN_ELEMENTS`` values (below that the array ops are quick, and a short
process does not pay numba's import, ~0.3 s).  The first call of a kernel compiles it
(about a second); numba caches it beside this file.  ``MINIPAR_CPU_KERNELS=0`` turns
them off.  Importing this module registers it for the NumPy backend
(``ops_math.use_fused_kernels``); ``import minipar.nn`` imports it.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys

import numpy as np

from minipar.autograd import ops_math
from minipar.autograd.ops_nn import layernorm_param_grads
from minipar.autograd.rows import for_row_blocks

MIN_ELEMENTS = 1 << 15
SPLIT_ELEMENTS = 1 << 18   # measured, 2 threads against 1 on the spinning pool: 524 K values
                           # gain (GELU 0.70-0.91×, causal softmax 0.67-0.89×, LayerNorm
                           # (2048, 256) 0.85×), 131 K do not (LayerNorm 1.0×)
OPS = ("layernorm", "gelu", "attention_softmax", "adamw", "sum_of_squares",
       "rmsnorm", "rotary", "swiglu")      # the last three: fused_cpu_llama.py
DTYPES = (np.dtype("float32"), np.dtype("float64"))   # compared as dtypes, not names: under
# NumPy 2 str(dtype) runs Python code (measured on the loaded 2-core machine: 44 µs to
# compare two names, 0.2 µs to compare two dtypes), and every op of the step asks


def available():
    """numba is installed and not switched off by ``MINIPAR_CPU_KERNELS=0``."""
    return (os.environ.get("MINIPAR_CPU_KERNELS", "1") != "0"
            and importlib.util.find_spec("numba") is not None)


_AVAILABLE = available()


def supports(dtype, *other_dtypes, elements=0):
    """Whether the compiled kernels take these arrays: one dtype, float32 or float64,
    at least MIN_ELEMENTS values, and numba available."""
    return (_AVAILABLE and elements >= MIN_ELEMENTS and dtype in DTYPES
            and all(d == dtype for d in other_dtypes))


@functools.lru_cache(maxsize=None)
def _kernels():
    """{name: compiled row loop} (``cpu_loops.py``); imports numba on the first call."""
    from minipar.kernels.cpu_loops import LOOPS
    return LOOPS


def _blocks(rows, kernel, elements):
    """kernel(lo, hi) over rows [0, rows): in blocks on the rank's threads from
    SPLIT_ELEMENTS values on, else in one call on this thread."""
    for_row_blocks(rows, kernel, elements, threads=None if elements >= SPLIT_ELEMENTS else 1)


def _run(name, rows, elements, *args):
    """The named kernel over rows [0, rows)."""
    kernel = _kernels()[name]
    _blocks(rows, lambda lo, hi: kernel(lo, hi, *args), elements)


def _gelu_constants(dtype):
    return np.array([np.sqrt(2.0 / np.pi), 0.044715, 0.5, 1.0], dtype=dtype)


def layernorm_forward(x, weight, bias, eps=1e-5):
    """(y like x, x̂ (rows, d), inv_sigma (rows, 1)) over the last axis of x."""
    d = x.shape[-1]
    x2 = np.ascontiguousarray(x.reshape(-1, d))
    y, xhat = np.empty_like(x2), np.empty_like(x2)
    inv_sigma = np.empty((x2.shape[0], 1), dtype=x.dtype)
    k = x.dtype.type
    _run("layernorm_forward", x2.shape[0], x2.size, x2, np.ascontiguousarray(weight),
         np.ascontiguousarray(bias), k(1 / d), k(eps), y, xhat, inv_sigma)
    return y.reshape(x.shape), xhat, inv_sigma


def layernorm_backward(grad, xhat, inv_sigma, weight, needs=(True, True, True)):
    """(dx, dw, db), None where ``needs`` (for x, w, b) is False; dw and db as the array op."""
    rows, d = xhat.shape
    g2 = np.ascontiguousarray(grad.reshape(rows, d))
    gw, gb = layernorm_param_grads(g2, xhat, weight.dtype, needs[1:])
    gx = None
    if needs[0]:
        gx = np.empty_like(g2)
        _run("layernorm_backward", rows, g2.size, g2, xhat, inv_sigma,
             np.ascontiguousarray(weight), g2.dtype.type(1 / d), gx)
        gx = gx.reshape(grad.shape)
    return gx, gw, gb


def gelu_forward(x):
    """(y, t), both like x: y = 0.5·x·(1 + t), t = tanh(c·(x + 0.044715·x³)).
    The tanh is NumPy's (vectorised; numba's is a scalar libm call, 7× slower here)."""
    flat = np.ascontiguousarray(x.reshape(-1))
    y, t = np.empty_like(flat), np.empty_like(flat)
    kernels, k = _kernels(), _gelu_constants(x.dtype)

    def block(lo, hi):
        kernels["gelu_inner"](lo, hi, flat, t, k)
        np.tanh(t[lo:hi], out=t[lo:hi])
        kernels["gelu_outer"](lo, hi, flat, t, y, k)

    _blocks(flat.size, block, flat.size)
    return y.reshape(x.shape), t.reshape(x.shape)


def gelu_backward(x, t, grad):
    """dx like x: dy · 0.5·((1 + t) + x·(1 - t²)·c·(1 + 3·0.044715·x²))."""
    xf, tf, gf = (np.ascontiguousarray(a.reshape(-1)) for a in (x, t, grad))
    dx = np.empty_like(xf)
    _run("gelu_backward", xf.size, xf.size, xf, tf, gf, dx, _gelu_constants(x.dtype))
    return dx.reshape(grad.shape)


def flush_below(dtype):
    """The size below which softmax's P and dS are set to 0: tiny/eps (float32 1e-31,
    float64 1e-292), so that P and dS times any factor above eps (the gradient dO, a
    key) stay normal numbers — a subnormal costs a microcode assist in every BLAS call
    that meets it (``cpu_loops.softmax_normalise``: the gpt2 preset's step went 1.75 s
    → 2.45 s after ten steps).  What is dropped is 10^24 below float32's rounding of the
    row's sum.  Half precisions are not flushed (their tiny/eps is not small)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        return dtype.type(0)
    info = np.finfo(dtype)
    return dtype.type(info.tiny / info.eps)


def attention_softmax_forward(scores, scale, causal=True):
    """P like scores (..., Nq, Nk): softmax over keys of scale·S, keys j > i + Nk - Nq
    masked when causal.  A row that sees no key is 0 (the array op gives NaN); a
    probability below ``flush_below(dtype)`` is 0."""
    n_queries, n_keys = scores.shape[-2:]
    s2 = np.ascontiguousarray(scores.reshape(-1, n_keys))
    p = np.empty_like(s2)
    kernels, scale = _kernels(), scores.dtype.type(scale)
    tiny = flush_below(scores.dtype)            # probabilities that would make subnormals: 0

    def block(lo, hi):
        kernels["softmax_shift"](lo, hi, s2, p, n_queries, bool(causal), scale)
        np.exp(p[lo:hi], out=p[lo:hi])
        kernels["softmax_normalise"](lo, hi, p, tiny)

    _blocks(s2.shape[0], block, s2.size)
    return p.reshape(scores.shape)


def attention_softmax_backward(probs, grad, scale):
    """dS like P (dP is cast to P's dtype first): scale · P ∘ (dP - Σ_keys dP∘P)."""
    n_keys = probs.shape[-1]
    p2 = np.ascontiguousarray(probs.reshape(-1, n_keys))
    g2 = np.ascontiguousarray(grad.astype(probs.dtype, copy=False).reshape(-1, n_keys))
    ds = np.empty_like(g2)
    _run("softmax_backward", g2.shape[0], g2.size, p2, g2, ds, probs.dtype.type(scale),
         flush_below(probs.dtype))
    return ds.reshape(grad.shape)


def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, m_hat_scale, v_hat_scale):
    """``optim.adamw_update`` in one pass over p, g, m, v (contiguous, one shape; weight
    decay a number or an array like p): m, v and p read and written once each, where the
    array code makes about fifteen passes.  The constants are rounded to p's dtype as
    NumPy rounds them."""
    k = np.array([lr, beta1, 1 - beta1, beta2, 1 - beta2, eps, m_hat_scale, v_hat_scale], dtype=p.dtype)
    decay = np.ascontiguousarray(weight_decay, dtype=p.dtype).reshape(-1)
    if decay.size not in (1, p.size):
        raise ValueError(f"weight decay has {decay.size} values for {p.size} parameters")
    flat = [a.reshape(-1) for a in (p, g, m, v)]
    _run("adamw", p.size, p.size, *flat, decay, k)


def sum_of_squares(x):
    """Σ x² in float64, as ``float((x.astype(float64) ** 2).sum())`` without the two
    temporaries: the gradient norm's 875 K float32 values in 56 µs against 479 µs."""
    return float(_kernels()["sum_of_squares"](np.ascontiguousarray(x).reshape(-1)))


from minipar.kernels.fused_cpu_llama import (  # noqa: E402,F401  (this module's OPS)
    rmsnorm_backward, rmsnorm_forward, rotary_backward, rotary_forward, swiglu_backward,
    swiglu_forward)

ops_math.use_fused_kernels(sys.modules[__name__], backend="numpy")
