"""Dense attention: the whole N×N matrix of probabilities in memory — the baseline.

With ``scale = 1/sqrt(d)`` and M the causal mask (``causal_mask``: query i sees key j
iff ``j <= i + Nk - Nq``, aligned to the bottom-right corner):

    forward    S = Q Kᵀ · scale,   S_ij = -inf where M hides key j
               P = softmax(S) row by row,   O = P V
    backward   dV = Pᵀ dO         dP = dO Vᵀ
               dS = P ∘ (dP - rowsum(P ∘ dP))          (the softmax Jacobian)
               dQ = dS K · scale   dK = dSᵀ Q · scale

It costs N² numbers per head (P is saved for backward); FlashAttention
(``flash_reference``) computes the same O and gradients without ever holding P.  This
is the one dense attention of minipar: the flash tests' oracle, ``flash_reference.
dense_attention`` and the naive column of ``bench attention``.

Arrays are (B, H, Nq, d) for q and (B, H, Nk, d) for k, v.  The products run in the
inputs' dtype; the softmax in at least float32 (fp16 inputs: float32 statistics, P
rounded back to fp16, as a naive GPU implementation does).  A query row that sees no
key (causal with Nq > Nk) gets P = 0, so output 0 and zero gradients, never NaN.
"""
from __future__ import annotations

import math

from minipar.autograd.ops_attention import causal_mask
from minipar.backend import widened, xp

__all__ = ["causal_mask", "dense_attention_forward", "dense_attention_backward"]


def dense_attention_forward(q, k, v, causal=True):
    """``(out, probs)``: O = softmax(Q Kᵀ/sqrt(d) + mask) V, and P (B, H, Nq, Nk) for backward."""
    scores = q @ k.swapaxes(-1, -2)
    scores = widened(scores) * (1.0 / math.sqrt(q.shape[-1]))  # softmax statistics in fp32
    if causal:
        scores = xp.where(causal_mask(q.shape[-2], k.shape[-2]), scores, -xp.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    # A row that sees nothing has max -inf: subtract 0 instead, so exp gives 0, not NaN.
    probs = xp.exp(scores - xp.where(row_max == -xp.inf, 0.0, row_max))
    row_sum = probs.sum(axis=-1, keepdims=True)
    probs = (probs / xp.where(row_sum > 0, row_sum, 1.0)).astype(q.dtype)
    return probs @ v, probs


def dense_attention_backward(q, k, v, probs, grad_out):
    """``(dq, dk, dv)`` from the saved probabilities, through the softmax Jacobian."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dv = probs.swapaxes(-1, -2) @ grad_out
    dprobs = grad_out @ v.swapaxes(-1, -2)
    dscores = probs * (dprobs - (probs * dprobs).sum(axis=-1, keepdims=True))
    return dscores @ k * scale, dscores.swapaxes(-1, -2) @ q * scale, dv
