"""The compiled loops behind ``fused_cpu.py``: each a numba function over rows [lo, hi).

Importing this module imports numba and compiles (or loads from numba's cache, beside
this file) every loop, so ``fused_cpu`` imports it only on the first kernel call.

Three rules, each measured, make these loops run near the machine's memory speed (and
``error_model="numpy"`` on every loop, below: Python's ZeroDivisionError check on each
division stops vectorisation):

1. Every constant comes in the arrays' dtype (``k``, ``inv_d``): one Python float makes a
   float32 loop float64 (10× slower for the GELU).
2. A loop slices its rows first and counts from 0: an index from ``range(lo, hi)`` is
   checked for wrap-around at every access, which stops vectorisation.
3. **Reductions first, for every row of a block; then the elementwise pass.**  A row's
   statistics (LayerNorm's mean and σ, the softmax's sum, the backward's dot products)
   go into a small per-row array, and a second loop applies them.  Written row by row
   instead (reduce row r, apply it to row r, go on to row r + 1), each row waits for its
   own reduction and square root before its pass can start; split, the processor
   overlaps the rows.  LayerNorm's forward on float32 (2048, 128): 168 µs row by row,
   98 µs split, as fast as copying the array.  A block larger than ``TWO_PASS_BYTES``
   (several times the L2 cache) goes row by row after all: each row then comes from
   memory once and stays in L1 for its second pass.  The sums are the same loops in
   the same order either way, so a row's bits do not depend on the block.

Sums may be re-associated so that they vectorise (``reassoc``), but infinities and NaN
keep their meaning (the mask is -inf): no ``nnan``/``ninf``.
"""
from __future__ import annotations

import functools

import numba
import numpy as np

FLAGS = {"reassoc", "contract", "nsz", "arcp"}
TWO_PASS_BYTES = 4 << 20   # rule 3 below; measured, float32: (2048, 128) to (8192, 128)
                           # gain, (8192, 256) and (8192, 768) lose (row by row streams better)
# error_model="numpy": x / 0 is inf or NaN as in NumPy, not Python's ZeroDivisionError,
# whose check on every division keeps a loop from vectorising (AdamW, 875 K values: 2.3 -> 0.28 ms)
jit = functools.partial(numba.njit, nogil=True, cache=True, fastmath=FLAGS, error_model="numpy")
# without "contract": fused into one multiply-add, ĝ - mean(ĝ) keeps ĝ's rounding error,
# and a row whose ĝ are all equal (d = 1) gets dx ≠ 0 (× s, up to 1/sqrt(eps))
jit_unfused = functools.partial(numba.njit, nogil=True, cache=True, fastmath=FLAGS - {"contract"},
                                error_model="numpy")
# IEEE arithmetic, operation for operation as NumPy's ufuncs: the same bits as the array code
jit_exact = functools.partial(numba.njit, nogil=True, cache=True, error_model="numpy")


@jit
def rows_per_pass(rows, d, itemsize):
    """Rule 3's chunk: every row of a block up to TWO_PASS_BYTES, else one row at a time."""
    return rows if rows * d * itemsize <= TWO_PASS_BYTES else 1


@jit
def layernorm_forward(lo, hi, x, w, b, inv_d, eps, y, xhat, inv_sigma):
    """μ, s = 1/sqrt(var + eps) per row; then x̂ = (x - μ)·s, y = x̂·w + b."""
    d = x.shape[1]
    one = inv_d * d
    chunk = rows_per_pass(hi - lo, d, x.itemsize)
    mean = np.empty(chunk, x.dtype)
    for c0 in range(lo, hi, chunk):
        c1 = min(hi, c0 + chunk)
        xc, yc, hc, sc = x[c0:c1], y[c0:c1], xhat[c0:c1], inv_sigma[c0:c1]
        n = xc.shape[0]
        for r in range(n):
            total = inv_d * 0
            for j in range(d):
                total += xc[r, j]
            mean[r] = total * inv_d
        for r in range(n):
            m, var = mean[r], inv_d * 0
            for j in range(d):
                c = xc[r, j] - m
                var += c * c
            sc[r, 0] = one / np.sqrt(var * inv_d + eps)
        for r in range(n):
            m, s = mean[r], sc[r, 0]
            for j in range(d):
                h = (xc[r, j] - m) * s
                hc[r, j] = h
                yc[r, j] = h * w[j] + b[j]


@jit_unfused
def layernorm_backward(lo, hi, g, xhat, inv_sigma, w, inv_d, gx):
    """With ĝ = g·w: mean(ĝ), mean(ĝ·x̂) per row; then dx = (ĝ - mean(ĝ) - x̂·mean(ĝ·x̂))·s."""
    d = g.shape[1]
    chunk = rows_per_pass(hi - lo, d, g.itemsize)
    mean_gh, mean_ghx = np.empty(chunk, g.dtype), np.empty(chunk, g.dtype)
    for c0 in range(lo, hi, chunk):
        c1 = min(hi, c0 + chunk)
        gc, hc, sc, dc = g[c0:c1], xhat[c0:c1], inv_sigma[c0:c1], gx[c0:c1]
        n = gc.shape[0]
        for r in range(n):
            sum_gh, sum_ghx = inv_d * 0, inv_d * 0
            for j in range(d):
                gh = gc[r, j] * w[j]
                sum_gh += gh
                sum_ghx += gh * hc[r, j]
            mean_gh[r], mean_ghx[r] = sum_gh * inv_d, sum_ghx * inv_d
        for r in range(n):
            a, c, s = mean_gh[r], mean_ghx[r], sc[r, 0]
            for j in range(d):
                dc[r, j] = (gc[r, j] * w[j] - a - hc[r, j] * c) * s


@jit
def gelu_inner(lo, hi, x, u, k):           # u = c·(x + a·x³),  k = (c, a, ½, 1)
    c, a = k[0], k[1]
    x, u = x[lo:hi], u[lo:hi]
    for i in range(x.size):
        v = x[i]
        u[i] = c * (v + a * v * v * v)


@jit
def gelu_outer(lo, hi, x, t, y, k):        # y = ½·x·(1 + t)
    half, one = k[2], k[3]
    x, t, y = x[lo:hi], t[lo:hi], y[lo:hi]
    for i in range(x.size):
        y[i] = half * x[i] * (one + t[i])


@jit
def gelu_backward(lo, hi, x, t, g, dx, k):
    c, a3, half, one = k[0], 3 * k[1], k[2], k[3]
    x, t, g, dx = x[lo:hi], t[lo:hi], g[lo:hi], dx[lo:hi]
    for i in range(x.size):
        v, th = x[i], t[i]
        dx[i] = g[i] * half * ((one + th) + v * (one - th * th) * c * (one + a3 * v * v))


@jit
def softmax_shift(lo, hi, s, z, n_queries, causal, scale):
    """z = scale·s - max over the keys a query sees, -inf for those it does not.
    (Row by row: its max, a comparison, does not gain from rule 3 — measured.)"""
    n_keys = s.shape[1]
    s, z = s[lo:hi], z[lo:hi]
    for r in range(s.shape[0]):
        seen = min(n_keys, (lo + r) % n_queries + n_keys - n_queries + 1) if causal else n_keys
        top = -np.inf
        for j in range(max(seen, 0)):
            z[r, j] = s[r, j] * scale
            top = max(top, z[r, j])
        for j in range(max(seen, 0)):
            z[r, j] -= top
        z[r, max(seen, 0):] = -np.inf


@jit
def softmax_normalise(lo, hi, e, tiny):
    """e /= Σ e, row by row (a row that saw no key is all 0 and stays so); a probability
    below ``tiny`` becomes 0 (``fused_cpu.flush_below``).  Subnormal numbers cost a
    BLAS microcode assist on each use: after ten steps of the gpt2 preset, the matmuls
    of the attention's gradient ran 4× slower on P's and dS's (the step 1.75 → 2.45 s)."""
    d = e.shape[1]
    chunk = rows_per_pass(hi - lo, d, e.itemsize)
    inv = np.empty(chunk, e.dtype)
    for c0 in range(lo, hi, chunk):
        ec = e[c0:min(hi, c0 + chunk)]
        n = ec.shape[0]
        for r in range(n):
            total = ec[r, 0] * 0
            for j in range(d):
                total += ec[r, j]
            inv[r] = (total * 0 + 1) / total if total > 0 else total * 0 + 1
        for r in range(n):
            q = inv[r]
            for j in range(d):
                x = ec[r, j] * q
                ec[r, j] = x if x >= tiny else x * 0


@jit
def softmax_backward(lo, hi, p, g, ds, scale, tiny):
    """dS = scale·P∘(dP - Σ_keys dP∘P); |dS| below ``tiny`` becomes 0
    (``softmax_normalise``)."""
    d = p.shape[1]
    chunk = rows_per_pass(hi - lo, d, p.itemsize)
    dots = np.empty(chunk, p.dtype)
    for c0 in range(lo, hi, chunk):
        c1 = min(hi, c0 + chunk)
        pc, gc, dc = p[c0:c1], g[c0:c1], ds[c0:c1]
        n = pc.shape[0]
        for r in range(n):
            dot = scale * 0
            for j in range(d):
                dot += gc[r, j] * pc[r, j]
            dots[r] = dot
        for r in range(n):
            dot = dots[r]
            for j in range(d):
                x = scale * pc[r, j] * (gc[r, j] - dot)
                dc[r, j] = x if abs(x) >= tiny else x * 0


# AdamW turns a gradient's last bit into a whole lr-sized step where m ≈ 0: its bits must
# not depend on whether a parameter went through this loop or the array code (jit_exact)
@jit_exact
def adamw(lo, hi, p, g, m, v, decay, k):   # k = (lr, β1, 1-β1, β2, 1-β2, eps, ŝ1, ŝ2)
    lr, b1, c1, b2, c2, eps, s1, s2 = k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7]
    p, g, m, v = p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi]
    per_element = decay.size > 1                  # a flat bucket's mask, else one value
    if per_element:
        decay = decay[lo:hi]
    for i in range(p.size):
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * (gi * gi)
        m[i], v[i] = mi, vi
        wd = decay[i] if per_element else decay[0]
        p[i] -= lr * (mi * s1 / (np.sqrt(vi * s2) + eps) + wd * p[i])


@jit
def sum_of_squares(x):
    """Σ x² of a 1-D array, each value widened to float64 first (one read, no temporaries)."""
    total = 0.0
    for i in range(x.size):
        v = np.float64(x[i])
        total += v * v
    return total


LOOPS = {f.__name__: f for f in (layernorm_forward, layernorm_backward, gelu_inner, gelu_outer,
                                 gelu_backward, softmax_shift, softmax_normalise, softmax_backward,
                                 adamw, sum_of_squares)}
