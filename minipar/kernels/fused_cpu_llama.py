"""The llama block's fused ops compiled for the CPU (numba): one pass over memory per op.

Written as arrays, RMSNorm's forward reads and writes its (rows, d) activation about
five times (x², the mean, x·r, ·w, the cast), the rotary embedding builds its
``concatenate`` of the two negated halves, and SwiGLU's silu(gate)·up is two ops and six
passes (tanh, +1, ·½, ·gate, ·up, and a saved silu(gate) for the product's backward).
Compiled (``cpu_loops_llama.py``), each reads its inputs and writes its outputs once:

    rmsnorm_forward(x, w, eps)              -> y, x̂ (rows, d), inv_rms (rows, 1)
    rmsnorm_backward(dy, x̂, inv_rms, w, needs) -> dx, dw = Σ dy·x̂
    rotary_forward(x, cos, sin) -> y;   rotary_backward(dy, cos, sin) -> dx
    swiglu_forward(gate, up) -> y, σ;   swiglu_backward(gate, up, σ, dy) -> d_gate, d_up

The contract of ``fused_cpu.py`` holds: float32/float64 only (half precision takes the
array code), ``kernel(lo, hi, ...)`` over row blocks on the rank's threads from
``fused_cpu.SPLIT_ELEMENTS`` values on, nogil, a row's bits independent of the thread
count.  ``fused_cpu`` re-exports these functions and lists them in its ``OPS``
("rmsnorm", "rotary", "swiglu"), so the autograd ops find them as they find LayerNorm's.

The rotary embedding's input is usually ``heads()``' transposed view of a projection,
(B, H, N, d) over (B, N, H, d) memory; the loops read that memory as it lies (a row's
position then changes every H rows), and the output keeps the same layout, as a NumPy
ufunc's would: no copy on the way in or out.
"""
from __future__ import annotations

import functools

import numpy as np

from minipar.autograd.ops_nn import layernorm_param_grads
from minipar.autograd.rows import for_row_blocks


@functools.lru_cache(maxsize=None)
def _kernels():
    """{name: compiled loop} (``cpu_loops_llama.py``); imports numba on the first call."""
    from minipar.kernels.cpu_loops_llama import LOOPS
    return LOOPS


def _blocks(rows, block, elements):
    """block(lo, hi) over rows [0, rows): in blocks on the rank's threads when the array
    is big enough (``fused_cpu.SPLIT_ELEMENTS``), else in one call on this thread."""
    from minipar.kernels import fused_cpu          # imports this module: import it late
    threads = None if elements >= fused_cpu.SPLIT_ELEMENTS else 1
    for_row_blocks(rows, block, elements, threads=threads)


def _run(name, rows, elements, *args):
    """The named loop over rows [0, rows)."""
    kernel = _kernels()[name]
    _blocks(rows, lambda lo, hi: kernel(lo, hi, *args), elements)


def rmsnorm_forward(x, weight, eps=1e-5):
    """(y like x, x̂ (rows, d), inv_rms (rows, 1)) over the last axis of x."""
    d = x.shape[-1]
    x2 = np.ascontiguousarray(x.reshape(-1, d))
    y, xhat = np.empty_like(x2), np.empty_like(x2)
    inv_rms = np.empty((x2.shape[0], 1), dtype=x.dtype)
    k = x.dtype.type
    _run("rmsnorm_forward", x2.shape[0], x2.size, x2, np.ascontiguousarray(weight),
         k(1 / d), k(eps), y, xhat, inv_rms)
    return y.reshape(x.shape), xhat, inv_rms


def rmsnorm_backward(grad, xhat, inv_rms, weight, needs=(True, True)):
    """(dx, dw), None where ``needs`` (for x, w) is False; dw = Σ dy·x̂ as the array op."""
    rows, d = xhat.shape
    g2 = np.ascontiguousarray(grad.reshape(rows, d))
    gw = layernorm_param_grads(g2, xhat, weight.dtype, (True, False))[0] if needs[1] else None
    gx = None
    if needs[0]:
        gx = np.empty_like(g2)
        _run("rmsnorm_backward", rows, g2.size, g2, xhat, inv_rms,
             np.ascontiguousarray(weight), g2.dtype.type(1 / d), gx)
        gx = gx.reshape(grad.shape)
    return gx, gw


def _as_rows(x):
    """(rows of x (R, d), inner, out like x, rows of out): x's memory read as rows without
    a copy when it is C-contiguous (inner 1) or a (B, H, N, d) view of (B, N, H, d)
    memory (inner H); any other layout is copied to C order first."""
    d = x.shape[-1]
    if x.ndim == 4 and not x.flags.c_contiguous and x.transpose(0, 2, 1, 3).flags.c_contiguous:
        memory = x.transpose(0, 2, 1, 3)
        out = np.empty_like(memory)
        return memory.reshape(-1, d), x.shape[1], out.transpose(0, 2, 1, 3), out.reshape(-1, d)
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    return x.reshape(-1, d), 1, out, out.reshape(-1, d)


def _rotary(name, x, cos, sin):
    rows, inner, out, out_rows = _as_rows(x)
    _run(name, rows.shape[0], rows.size, rows, np.ascontiguousarray(cos),
         np.ascontiguousarray(sin), out_rows, x.shape[-2], inner)
    return out


def rotary_forward(x, cos, sin):
    """x·cos + rot(x)·sin for x (..., n, d), d even, and tables (n, d)."""
    return _rotary("rotary_forward", x, cos, sin)


def rotary_backward(grad, cos, sin):
    """dy·cos + rotᵀ(dy·sin): the rotary embedding's gradient."""
    return _rotary("rotary_backward", grad, cos, sin)


def _swiglu_constants(dtype):
    return np.array([0.5, 1.0], dtype=dtype)


def swiglu_forward(gate, up):
    """(y = silu(gate)·up, σ = sigmoid(gate)), both like gate.  σ = ½(1 + tanh(gate/2)),
    the tanh NumPy's (vectorised; numba's is a scalar libm call)."""
    g = np.ascontiguousarray(gate).reshape(-1)
    u = np.ascontiguousarray(up).reshape(-1)
    y, t = np.empty_like(g), np.empty_like(g)
    kernel, k = _kernels()["swiglu_forward"], _swiglu_constants(g.dtype)

    def block(lo, hi):
        np.multiply(g[lo:hi], k[0], out=t[lo:hi])
        np.tanh(t[lo:hi], out=t[lo:hi])
        kernel(lo, hi, g, u, t, y, k)

    _blocks(g.size, block, g.size)
    return y.reshape(gate.shape), t.reshape(gate.shape)


def swiglu_backward(gate, up, sigma, grad):
    """(d_gate, d_up), both like grad; each block runs both loops on its values."""
    g, u, s, dy = (np.ascontiguousarray(a).reshape(-1) for a in (gate, up, sigma, grad))
    d_gate, d_up = np.empty_like(dy), np.empty_like(dy)
    kernels, k = _kernels(), _swiglu_constants(g.dtype)

    def block(lo, hi):
        kernels["swiglu_backward_up"](lo, hi, g, s, dy, d_up)
        kernels["swiglu_backward_gate"](lo, hi, g, u, s, dy, d_gate, k)

    _blocks(g.size, block, g.size)
    return d_gate.reshape(grad.shape), d_up.reshape(grad.shape)
