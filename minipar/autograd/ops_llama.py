"""The llama block's own ops, each one Function with its backward derived by hand:
RMSNorm, the rotary embedding and SwiGLU's gated product (one op each instead of the
several ordinary ops they take written out: on a CPU a small model's step is mostly
per-op Python).  Where compiled kernels are registered for these arrays
(``ops_math.fused_kernels``: on the CPU ``kernels/fused_cpu_llama.py``), each runs as one
pass over memory; otherwise the array code below.

RMSNorm over the last axis (h features), r = 1/sqrt(mean(x²) + eps), x̂ = x·r:

    y = x̂·w            dx = r·(ĝ - x̂·mean(ĝ·x̂)),  ĝ = dy·w            dw = Σ dy·x̂

Rotary embedding, x = [a | b] (its two halves) and tables cos, sin of (n, d):

    y = x·cos + rot(x)·sin,  rot([a | b]) = [-b | a]
    dx = dy·cos + rotᵀ(dy·sin),  rotᵀ([u | v]) = [v | -u]      (rot is a linear map)

SwiGLU's product, σ = sigmoid(gate) = (1 + tanh(gate/2))/2:

    y = silu(gate)·up = gate·σ·up     d_up = dy·gate·σ     d_gate = dy·up·σ·(1 + gate·(1 - σ))

Half-precision inputs are normalised in float32 and rounded once (as the other
statistics of minipar's ops); silu is computed in float32 and rounded before the
product (as ``ops.silu`` then ``*``); the rotation works in the input's dtype.
"""
from __future__ import annotations

from minipar.backend import widened, xp
from minipar.autograd.function import Function
from minipar.autograd.ops_math import fused_kernels
from minipar.autograd.ops_nn import layernorm_param_grads


class RMSNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, eps=1e-5):
        if fused := fused_kernels("rmsnorm", x, weight):        # compiled: kernels/fused_cpu*
            y, xhat, inv_rms = fused.rmsnorm_forward(x, weight, eps)
            ctx.save_for_backward(xhat, inv_rms)
            return y
        wide = widened(x)
        inv_rms = 1.0 / xp.sqrt((wide * wide).mean(axis=-1, keepdims=True) + eps)
        xhat = wide * inv_rms
        ctx.save_for_backward(xhat, inv_rms)     # weight: read from ctx.inputs (see Linear)
        return (xhat * weight).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx, g):
        xhat, inv_rms = ctx.saved
        w = ctx.input_value(1)
        nx, nw = ctx.needs_input_grad[:2]
        if fused := fused_kernels("rmsnorm", g, w):
            return fused.rmsnorm_backward(g, xhat, inv_rms, w, (nx, nw)) + (None,)
        d = xhat.shape[-1]
        gw = None
        if nw:
            gw, _ = layernorm_param_grads(g.reshape(-1, d), xhat.reshape(-1, d), w.dtype,
                                          (True, False))
        gx = None
        if nx:
            gh = widened(g) * w
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
        if x.shape[-1] % 2 == 0 and (fused := fused_kernels("rotary", x, cos, sin)):
            return fused.rotary_forward(x, cos, sin)
        return x * cos + _rotate(x, 1) * sin

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved
        if g.shape[-1] % 2 == 0 and (fused := fused_kernels("rotary", g, cos, sin)):
            return fused.rotary_backward(g, cos, sin), None, None
        return g * cos + _rotate(g * sin, -1), None, None


class SwiGLU(Function):
    """silu(gate)·up: the gated product of the llama MLP, between its projections."""

    @staticmethod
    def forward(ctx, gate, up):
        if fused := fused_kernels("swiglu", gate, up):
            y, sigma = fused.swiglu_forward(gate, up)
            ctx.save_for_backward(gate, up, sigma)
            return y
        wide = widened(gate)
        sigma = xp.tanh(wide * 0.5)
        sigma += 1.0
        sigma *= 0.5
        ctx.save_for_backward(gate, up, sigma)
        return (wide * sigma).astype(gate.dtype, copy=False) * up

    @staticmethod
    def backward(ctx, g):
        gate, up, sigma = ctx.saved
        if fused := fused_kernels("swiglu", gate, up, sigma, g):
            return fused.swiglu_backward(gate, up, sigma, g)
        n_gate, n_up = ctx.needs_input_grad
        d_up = g * (gate * sigma).astype(gate.dtype, copy=False) if n_up else None
        d_gate = None
        if n_gate:
            d_gate = 1.0 - sigma
            d_gate *= gate
            d_gate += 1.0
            d_gate *= sigma
            d_gate *= g * up
            d_gate = d_gate.astype(g.dtype, copy=False)
        return d_gate, d_up
