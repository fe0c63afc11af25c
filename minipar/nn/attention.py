"""Causal multi-head self-attention.

    q, k, v = split(x @ W_qkv)              each (B, H, N, d_head)
    P       = softmax(q kᵀ / sqrt(d_head) + causal mask)
    y       = concat_heads(P v) @ W_proj

``attention="naive"`` materialises P (B·H·N² numbers); ``"flash"`` calls the tiled
kernel of ``minipar.kernels``, which never does.  ``core`` is the part selective
recomputation re-runs in backward.

The core is a module of its own, ``AttentionCore``: the one place where q, k, v
become y; k and v may have fewer heads than q (grouped-query attention, the llama
block: ``naive_attention`` reads each group's key/value head in place).  The plain model, the tensor-parallel model (fewer heads per rank) and
selective recomputation (which wraps the core, ``Recompute(attn.core)``) all call it.
"""
from __future__ import annotations

import math

from minipar.autograd import ops
from minipar.nn.module import Module
from minipar.nn.layers import Linear


def naive_attention(q, k, v, causal=True):
    """softmax(q kᵀ / sqrt(d)) v with the causal mask, all in ordinary ops.

    Grouped-query attention: k and v may have fewer heads, Hkv, than q's H (H % Hkv == 0);
    query head h reads key/value head h // G, G = H/Hkv.  The query heads are viewed as
    (Hkv, G) and k, v as (Hkv, 1): the matmuls broadcast each key/value head over its
    group, so K and V are never repeated in memory, and the broadcast's backward (the
    autograd ``unbroadcast``) sums the group's gradients into dK, dV."""
    b, h, n, d = q.shape
    h_kv = k.shape[1]
    if h % h_kv:
        raise ValueError(f"{h} query heads cannot share {h_kv} key/value heads evenly")
    scale = 1.0 / math.sqrt(d)
    if h_kv == h:
        scores = q @ ops.transpose(k, (0, 1, 3, 2))
        return ops.attention_softmax(scores, scale, causal) @ v
    g = h // h_kv
    q5 = q.reshape(b, h_kv, g, n, d)
    k5, v5 = k.reshape(b, h_kv, 1, k.shape[2], d), v.reshape(b, h_kv, 1, v.shape[2], d)
    scores = (q5 @ ops.transpose(k5, (0, 1, 2, 4, 3))).reshape(b, h, n, k.shape[2])
    p = ops.attention_softmax(scores, scale, causal).reshape(b, h_kv, g, n, k.shape[2])
    return (p @ v5).reshape(b, h, n, d)


def attention_core(q, k, v, kind="naive", causal=True, implementation=None):
    """``implementation`` (flash only): None, "reference" or "emulated" (kernels/flash_attention).
    k, v: (B, Hkv, N, d) with Hkv dividing q's H (grouped-query attention)."""
    if kind == "naive":
        return naive_attention(q, k, v, causal)
    if kind == "flash":
        from minipar.kernels.flash_attention import flash_attention
        return flash_attention(q, k, v, causal=causal, implementation=implementation)
    raise ValueError(f"unknown attention {kind!r}; choose naive or flash")


class AttentionCore(Module):
    """y = softmax(q kᵀ/sqrt(d) + causal mask) v, naive or flash; no parameters.
    ``implementation`` picks the flash code explicitly (tests: "reference", "emulated")."""

    def __init__(self, kind="naive", causal=True, implementation=None):
        if kind not in ("naive", "flash"):
            raise ValueError(f"unknown attention {kind!r}; choose naive or flash")
        self.kind, self.causal, self.implementation = kind, causal, implementation

    def forward(self, q, k, v):
        return attention_core(q, k, v, self.kind, self.causal, self.implementation)


class CausalSelfAttention(Module):
    def __init__(self, d_model, n_head, rng, proj_std, dropout, attention="naive"):
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} is not divisible by n_head {n_head}")
        self.n_head = n_head
        self.qkv = Linear(d_model, 3 * d_model, rng)
        self.proj = Linear(d_model, d_model, rng, std=proj_std)
        self.drop = dropout
        self.core = AttentionCore(attention)

    def split_heads(self, qkv):
        """(B, N, 3·H·d) -> q, k, v each (B, H, N, d); the columns are [q | k | v], head-major.
        ``n_head`` is the number of heads this module computes (a tensor-parallel
        rank holds only its share)."""
        b, n, three_hd = qkv.shape
        h = self.n_head
        x = qkv.reshape(b, n, 3, h, three_hd // (3 * h)).transpose(2, 0, 3, 1, 4)
        return x[0], x[1], x[2]

    def forward(self, x):
        q, k, v = self.split_heads(self.qkv(x))
        y = self.core(q, k, v)
        b, h, n, d = y.shape
        y = y.transpose(0, 2, 1, 3).reshape(b, n, h * d)
        return self.drop(self.proj(y))
