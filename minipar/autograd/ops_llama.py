"""The llama block's own ops, each one Function with its backward derived by hand:
RMSNorm and the rotary embedding (one op each instead of the seven ordinary ops
they take written out: on a CPU a small model's step is mostly per-op Python).

RMSNorm over the last axis (h features), r = 1/sqrt(mean(x²) + eps), x̂ = x·r:

    y = x̂·w            dx = r·(ĝ - x̂·mean(ĝ·x̂)),  ĝ = dy·w            dw = Σ dy·x̂

Rotary embedding, x = [a | b] (its two halves) and tables cos, sin of (n, d):

    y = x·cos + rot(x)·sin,  rot([a | b]) = [-b | a]
    dx = dy·cos + rotᵀ(dy·sin),  rotᵀ([u | v]) = [v | -u]      (rot is a linear map)

Half-precision inputs are normalised in float32 and rounded once (as the other
statistics of minipar's ops); the rotation works in the input's dtype.
"""
from __future__ import annotations

from minipar.backend import xp
from minipar.autograd.function import Function
from minipar.autograd.ops_nn import _wide, layernorm_param_grads


class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, eps=1e-5):
        wide = _wide(x)
        inv_rms = 1.0 / xp.sqrt((wide * wide).mean(axis=-1, keepdims=True) + eps)
        xhat = wide * inv_rms
        ctx.save_for_backward(xhat, inv_rms)     # weight: read from ctx.inputs (see Linear)
        return (xhat * weight).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xhat, inv_rms = ctx.saved
        w = ctx.input_value(1)
        nx, nw = ctx.needs_input_grad[:2]
        d = xhat.shape[-1]
        gw = None
        if nw:
            gw, _ = layernorm_param_grads(g.reshape(-1, d), xhat.reshape(-1, d), w.dtype,
                                          (True, False))
        gx = None
        if nx:
            gh = _wide(g) * w
            gh -= xhat * ((gh * xhat).sum(axis=-1, keepdims=True) / d)
            gh *= inv_rms
            gx = gh.astype(g.dtype, copy=False)
        return gx, gw, None


def _rotate(x, sign):
    """[a | b] -> [-b | a] (sign 1: rot) or [b | -a] (sign -1: its transpose)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return xp.concatenate([-sign * b, sign * a], axis=-1)


class Rotary(Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return x * cos + _rotate(x, 1) * sin

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved
        return g * cos + _rotate(g * sin, -1), None, None
