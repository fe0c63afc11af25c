"""The causal mask and the attention softmax: the one rule for which keys a query
sees, and softmax(scale·S + M) as one fused op with its hand-derived backward.

Every attention path of minipar takes the mask from here: dense attention
(``kernels/dense.py``), the tiled flash reference, context parallelism's ring, and the
model's fused softmax below.
"""
from __future__ import annotations

from minipar.backend import wide_dtype, xp
from minipar.autograd.function import Function
from minipar.autograd.ops_math import fused_kernels
from minipar.autograd.rows import for_row_blocks, row_dot, row_sum


def causal_offset(nq, nk):
    """Query i sees key j iff j <= i + offset, offset = nk - nq.

    The causal mask aligned to the bottom-right corner (as FlashAttention >= 2.1 and a KV
    cache do): the last query sees every key.  With nq == nk it is plain j <= i."""
    return nk - nq


def causal_mask(nq, nk, q0=0, k0=0, rows=None, cols=None):
    """Boolean mask, True where query i may see key j (j <= i + nk - nq).

    The whole (nq, nk) mask by default; a tiled kernel asks for the (rows, cols) block
    whose top-left corner is query q0, key k0, and never builds the N×N one.
    The one causal rule of minipar: dense attention, the model's fused softmax
    (``causal_bias``) and the tiled flash reference all use it."""
    rows = nq - q0 if rows is None else rows
    cols = nk - k0 if cols is None else cols
    query = xp.arange(q0, q0 + rows)[:, None]
    key = xp.arange(k0, k0 + cols)[None, :]
    return key <= query + causal_offset(nq, nk)


_causal_bias = {}


def causal_bias(nq, nk, dtype):
    """(nq, nk) array: 0 where ``causal_mask`` lets query i see key j, -inf elsewhere.
    Cached: every layer of every step uses the same one."""
    key = (nq, nk, str(dtype), type(xp.zeros(0)).__module__)
    if key not in _causal_bias:
        _causal_bias[key] = xp.where(causal_mask(nq, nk), 0.0, -xp.inf).astype(dtype)
    return _causal_bias[key]


class AttentionSoftmax(Function):
    """P = softmax(scale·S + M) over the last axis, M = -inf above the diagonal when
    causal (key j > query i + offset, offset = Nk - Nq).  dS = scale · P ∘ (dP - Σ dP∘P).
    One fused op instead of scale, mask and softmax, updating one array in place;
    each (batch, head) matrix is a block of rows for the rank's threads (``rows.py``)."""

    @staticmethod
    def forward(ctx, scores, scale, causal=True):
        ctx.scale = scale
        if fused := fused_kernels("attention_softmax", scores):  # compiled: kernels/fused_*.py
            ctx.save_for_backward(fused.attention_softmax_forward(scores, scale, causal))
            return ctx.saved[0]
        nq, nk = scores.shape[-2:]
        s3 = scores.reshape(-1, nq, nk)
        wide = wide_dtype(s3.dtype)
        p = xp.empty(s3.shape, dtype=scores.dtype)
        bias = causal_bias(nq, nk, wide) if causal else None
        in_place = p.dtype == wide

        def rows(lo, hi):
            if in_place:             # work in the output itself
                z = xp.multiply(s3[lo:hi], scale, out=p[lo:hi])
            else:
                z = xp.multiply(s3[lo:hi], scale, dtype=wide)
            if bias is not None:
                z += bias
            z -= z.max(axis=-1, keepdims=True)
            xp.exp(z, out=z)
            z /= row_sum(z)
            if not in_place:
                p[lo:hi] = z

        for_row_blocks(s3.shape[0], rows, s3.size)
        p = p.reshape(scores.shape)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved
        if fused := fused_kernels("attention_softmax", p):
            return fused.attention_softmax_backward(p, g, ctx.scale), None, None
        nq, nk = p.shape[-2:]
        p3, g3 = p.reshape(-1, nq, nk), g.reshape(-1, nq, nk)
        r = xp.empty(g3.shape, dtype=xp.result_type(g, p))

        def rows(lo, hi):
            gb, pb, rb = g3[lo:hi], p3[lo:hi], r[lo:hi]
            xp.subtract(gb, row_dot(gb, pb), out=rb)
            rb *= pb
            rb *= ctx.scale

        for_row_blocks(g3.shape[0], rows, g3.size)
        return r.reshape(g.shape), None, None
