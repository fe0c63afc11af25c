"""The llama block's compiled loops behind ``fused_cpu_llama.py``: RMSNorm, the rotary
embedding and SwiGLU, each a numba function over rows (or values) [lo, hi).

They follow ``cpu_loops.py``'s three rules (constants in the arrays' dtype, slices
counted from 0, a block's reductions before its elementwise pass) and use its
decorators:

    rmsnorm_forward    per row s = 1/sqrt(Σ x²/d + eps);  then x̂ = x·s, y = x̂·w
    rmsnorm_backward   per row c = Σ ĝ·x̂/d, ĝ = g·w;       then dx = (ĝ - x̂·c)·s
    rotary_forward     y  = x·cos + rot(x)·sin,     rot([a | b]) = [-b | a]
    rotary_backward    dx = g·cos + rotᵀ(g·sin),    rotᵀ([u | v]) = [v | -u]
    swiglu_forward     σ = (1 + t)/2 from t = tanh(gate/2);  y = gate·σ·up
    swiglu_backward_*  d_up = dy·gate·σ,   d_gate = dy·up·σ·(1 + gate·(1 - σ))

The rotation reads each half of a row from the other half, in place of the array code's
``concatenate`` temporaries; it is IEEE arithmetic operation for operation
(``jit_exact``), so it gives the array code's bits.  A row of the rotary loops is one
(token, head) vector; its position, the row of the cos/sin tables, is
``(row // inner) % n_positions`` (``inner`` = 1 when heads are the outer axis, the
number of heads when the array is laid out (batch, position, head, feature)).
"""
from __future__ import annotations

import numpy as np

from minipar.kernels.cpu_loops import jit, jit_exact, jit_unfused, rows_per_pass


@jit
def rmsnorm_forward(lo, hi, x, w, inv_d, eps, y, xhat, inv_rms):
    """s = 1/sqrt(mean(x²) + eps) per row; then x̂ = x·s, y = x̂·w."""
    d = x.shape[1]
    one = eps * 0 + 1
    chunk = rows_per_pass(hi - lo, d, x.itemsize)
    for c0 in range(lo, hi, chunk):
        c1 = min(hi, c0 + chunk)
        xc, yc, hc, sc = x[c0:c1], y[c0:c1], xhat[c0:c1], inv_rms[c0:c1]
        n = xc.shape[0]
        for r in range(n):
            total = inv_d * 0
            for j in range(d):
                total += xc[r, j] * xc[r, j]
            sc[r, 0] = one / np.sqrt(total * inv_d + eps)
        for r in range(n):
            s = sc[r, 0]
            for j in range(d):
                h = xc[r, j] * s
                hc[r, j] = h
                yc[r, j] = h * w[j]


@jit_unfused
def rmsnorm_backward(lo, hi, g, xhat, inv_rms, w, inv_d, gx):
    """With ĝ = g·w: c = mean(ĝ·x̂) per row; then dx = (ĝ - x̂·c)·s."""
    d = g.shape[1]
    chunk = rows_per_pass(hi - lo, d, g.itemsize)
    mean_ghx = np.empty(chunk, g.dtype)
    for c0 in range(lo, hi, chunk):
        c1 = min(hi, c0 + chunk)
        gc, hc, sc, dc = g[c0:c1], xhat[c0:c1], inv_rms[c0:c1], gx[c0:c1]
        n = gc.shape[0]
        for r in range(n):
            total = inv_d * 0
            for j in range(d):
                total += gc[r, j] * w[j] * hc[r, j]
            mean_ghx[r] = total * inv_d
        for r in range(n):
            c, s = mean_ghx[r], sc[r, 0]
            for j in range(d):
                dc[r, j] = (gc[r, j] * w[j] - hc[r, j] * c) * s


@jit_exact
def rotary_forward(lo, hi, x, cos, sin, y, n_positions, inner):
    """y[:h] = a·cos - b·sin,  y[h:] = b·cos + a·sin  for the row x = [a | b]."""
    half = x.shape[1] // 2
    x, y = x[lo:hi], y[lo:hi]
    for r in range(x.shape[0]):
        p = ((lo + r) // inner) % n_positions
        xr, yr, cr, sr = x[r], y[r], cos[p], sin[p]
        for j in range(half):
            yr[j] = xr[j] * cr[j] - xr[j + half] * sr[j]
            yr[j + half] = xr[j + half] * cr[j + half] + xr[j] * sr[j + half]


@jit_exact
def rotary_backward(lo, hi, g, cos, sin, dx, n_positions, inner):
    """dx[:h] = u·cos + v·sin[h:],  dx[h:] = v·cos - u·sin[:h]  for the row g = [u | v]."""
    half = g.shape[1] // 2
    g, dx = g[lo:hi], dx[lo:hi]
    for r in range(g.shape[0]):
        p = ((lo + r) // inner) % n_positions
        gr, dr, cr, sr = g[r], dx[r], cos[p], sin[p]
        for j in range(half):
            dr[j] = gr[j] * cr[j] + gr[j + half] * sr[j + half]
            dr[j + half] = gr[j + half] * cr[j + half] - gr[j] * sr[j]


@jit
def swiglu_forward(lo, hi, gate, up, t, y, k):     # k = (½, 1); t holds tanh(gate/2)
    """σ = ½·(1 + t), kept in t for the backward;  y = gate·σ·up."""
    half, one = k[0], k[1]
    gate, up, t, y = gate[lo:hi], up[lo:hi], t[lo:hi], y[lo:hi]
    for i in range(gate.size):
        s = half * (one + t[i])
        t[i] = s
        y[i] = gate[i] * s * up[i]


# The backward's two outputs are two loops: one loop writing both arrays does not
# vectorise (numba cannot rule out that they overlap the four inputs; measured, float32
# 1.4 M values: 7.0 ms in one loop, 1.5 ms for each of the two)
@jit
def swiglu_backward_up(lo, hi, gate, sigma, dy, d_up):
    """d_up = dy·gate·σ."""
    gate, sigma, dy, d_up = gate[lo:hi], sigma[lo:hi], dy[lo:hi], d_up[lo:hi]
    for i in range(gate.size):
        d_up[i] = dy[i] * (gate[i] * sigma[i])


@jit
def swiglu_backward_gate(lo, hi, gate, up, sigma, dy, d_gate, k):
    """d_gate = dy·up·σ·(1 + gate·(1 - σ))."""
    one = k[1]
    gate, up, sigma, dy, d_gate = gate[lo:hi], up[lo:hi], sigma[lo:hi], dy[lo:hi], d_gate[lo:hi]
    for i in range(gate.size):
        s = sigma[i]
        d_gate[i] = ((one - s) * gate[i] + one) * s * (dy[i] * up[i])


LOOPS = {f.__name__: f for f in (rmsnorm_forward, rmsnorm_backward, rotary_forward,
                                 rotary_backward, swiglu_forward, swiglu_backward_up,
                                 swiglu_backward_gate)}
