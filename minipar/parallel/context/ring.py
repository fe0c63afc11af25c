"""Ring attention: causal attention over a sequence split across the cp ranks.

Rank r holds the queries, keys and values of its two chunks (``split.py``).  Forward,
for t = 0 .. C-1 it holds the K/V block of rank (r - t) mod C; it starts passing that
block on to rank r+1 (non-blocking, so the transfer overlaps the compute), attends its
queries to it, and merges the partial result (o_t, L_t) into the running one (o, L)
with the online-softmax rule:

    L' = log(e^L + e^L_t)          o' = o·e^(L - L') + o_t·e^(L_t - L')

where L is the log-sum-exp of the scores of each query row.  After C blocks, o is the
exact softmax attention of every query over all the keys it may see.

Backward needs only the final (o, L) — as FlashAttention's does: with D = rowsum(dO∘o)
and P = exp(S - L) rebuilt per block, each block gives its part of dQ, dK, dV.  The K/V
blocks go round the ring again, each with its dK/dV accumulator; after C hops every
accumulator is back with the rank that owns those keys.

Per chunk pair the work is the attention core of the model: "naive" (dense scores) or
"flash" (the tiled kernel, which returns the log-sum-exp this merge needs).

Grouped-query attention: k and v have Hkv = H/G heads, and they travel round the ring
as they are — each hop moves 2·B·Hkv·(S/C)·d numbers, G times fewer than repeating
K/V to H heads before sending would.  Each chunk pair reads a KV head in place for its
G query heads (``grouped_views``) and sums dK, dV over the group, so the accumulators
that travel back are Hkv heads too.
"""
from __future__ import annotations

import math

from minipar.autograd import Function
from minipar.autograd.ops_attention import causal_bias
from minipar.backend import wide_dtype, widened, xp
from minipar.kernels.flash_reference import grouped_views
from minipar.nn.module import Module
from minipar.parallel.context.split import chunks_of, pair_kind, positions_of


# ---------------------------------------------------------------- one chunk pair
def pair_forward(q, k, v, kind, diagonal, implementation=None):
    """(o, L) of queries q (B, H, n, d) over keys k, v (B, Hkv, n, d): all of them, or
    causally on the diagonal."""
    if kind == "flash":
        from minipar.kernels.flash_attention import flash_forward
        c = xp.ascontiguousarray
        return flash_forward(c(q), c(k), c(v), diagonal, implementation)
    q_shape = q.shape
    q, k, v = grouped_views(q, k, v)                     # (B, Hkv, G, n, d), (B, Hkv, 1, n, d)
    s = widened(q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if diagonal:
        s = s + causal_bias(s.shape[-2], s.shape[-1], s.dtype)
    m = s.max(axis=-1, keepdims=True)
    p = xp.exp(s - m)
    total = p.sum(axis=-1, keepdims=True)
    out = (p.astype(v.dtype) @ v) / total.astype(v.dtype)
    return out.reshape(q_shape), (m + xp.log(total)).reshape(q_shape[:-1])


def pair_backward(q, k, v, out, lse, grad_out, kind, diagonal, implementation=None):
    """(dq, dk, dv) of one chunk pair, from the FINAL output and log-sum-exp of q's rows;
    dk, dv shaped like k (summed over each KV head's group of query heads)."""
    if kind == "flash":
        from minipar.kernels.flash_attention import flash_backward
        c = xp.ascontiguousarray
        return flash_backward(c(q), c(k), c(v), c(out), c(lse), c(grad_out), diagonal, implementation)
    q_shape, kv_shape = q.shape, k.shape
    q, k, v = grouped_views(q, k, v)                     # (B, Hkv, G, n, d), (B, Hkv, 1, n, d)
    out, grad_out, lse = out.reshape(q.shape), grad_out.reshape(q.shape), lse.reshape(q.shape[:-1])
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = widened(q @ k.swapaxes(-1, -2)) * scale
    if diagonal:
        s = s + causal_bias(s.shape[-2], s.shape[-1], s.dtype)
    p = xp.exp(s - lse[..., None])                       # this block's share of softmax
    g, o = widened(grad_out), widened(out)
    d = (g * o).sum(axis=-1, keepdims=True)
    dv = (p.swapaxes(-1, -2) @ g).sum(axis=2)            # summed over the group
    ds = p * (g @ widened(v).swapaxes(-1, -2) - d)
    dq = (ds @ widened(k)) * scale
    dk = (ds.swapaxes(-1, -2) @ widened(q)).sum(axis=2) * scale
    return (dq.astype(q.dtype).reshape(q_shape), dk.astype(k.dtype).reshape(kv_shape),
            dv.astype(v.dtype).reshape(kv_shape))


def merge(out, lse, o, l):
    """The online-softmax merge of (o, l) into the running (out, lse), in place."""
    new = xp.logaddexp(lse, l)
    out *= xp.exp(lse - new)[..., None].astype(out.dtype)
    out += o * xp.exp(l - new)[..., None].astype(out.dtype)
    lse[...] = new


# ---------------------------------------------------------------- the ring
class _Ring:
    """Rank r's view of the ring: neighbours, chunk layout, one shift at a time."""

    def __init__(self, comm, zigzag):
        self.comm, self.zigzag = comm, zigzag
        self.C, self.r = comm.size, comm.rank
        self.next, self.prev = (self.r + 1) % self.C, (self.r - 1) % self.C

    def start_shift(self, buf, tag):
        """Send ``buf`` on to r+1 and receive r-1's block; returns (received, requests)."""
        out = xp.empty_like(buf)
        return out, [self.comm.isend(buf, self.next, tag=tag), self.comm.irecv(out, self.prev, tag=tag)]

    def finish(self, requests):
        self.comm.waitall(requests)

    def pairs(self, owner):
        """(my chunk slot, owner's chunk slot, diagonal?) of every pair that is not masked."""
        mine, theirs = chunks_of(self.r, self.C, self.zigzag), chunks_of(owner, self.C, self.zigzag)
        for i, a in enumerate(mine):
            for j, b in enumerate(theirs):
                kind = pair_kind(a, b)
                if kind != "none":
                    yield i, j, kind == "diag"


def _half(x, i):
    """Chunk slot i (0 or 1) of a local (B, H, 2c, d) array."""
    c = x.shape[2] // 2
    return x[:, :, i * c:(i + 1) * c]


class RingAttention(Function):
    """y = causal softmax attention of local q over the keys of every cp rank."""

    @staticmethod
    def forward(ctx, q, k, v, core):
        ring = _Ring(core.comm, core.zigzag)
        out = xp.zeros(q.shape, dtype=wide_dtype(q.dtype))
        lse = xp.full(q.shape[:3], -xp.inf, dtype=out.dtype)
        kv = xp.ascontiguousarray(xp.stack([k, v]))
        for t in range(ring.C):
            owner = (ring.r - t) % ring.C
            if t < ring.C - 1:                         # the next block travels meanwhile
                nxt, reqs = ring.start_shift(kv, tag=t)
            for i, j, diagonal in ring.pairs(owner):
                rows = slice(i * (q.shape[2] // 2), (i + 1) * (q.shape[2] // 2))
                o, l = pair_forward(_half(q, i), _half(kv[0], j), _half(kv[1], j), core.kind,
                                    diagonal, core.implementation)
                merge(out[:, :, rows], lse[:, :, rows], widened(o), l.astype(lse.dtype))
            if t < ring.C - 1:
                ring.finish(reqs)
                kv = nxt
        out = out.astype(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.core = core
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved
        core = ctx.core
        ring = _Ring(core.comm, core.zigzag)
        n = q.shape[2] // 2
        dq = xp.zeros(q.shape, dtype=wide_dtype(q.dtype))
        kv = xp.ascontiguousarray(xp.stack([k, v]))
        dkv = xp.zeros(kv.shape, dtype=dq.dtype)       # the accumulator travelling with kv
        for t in range(ring.C):
            owner = (ring.r - t) % ring.C
            if t < ring.C - 1:
                nxt, reqs = ring.start_shift(kv, tag=t)
            for i, j, diagonal in ring.pairs(owner):
                rows = slice(i * n, (i + 1) * n)
                gq, gk, gv = pair_backward(_half(q, i), _half(kv[0], j), _half(kv[1], j),
                                           out[:, :, rows], lse[:, :, rows], grad_out[:, :, rows],
                                           core.kind, diagonal, core.implementation)
                dq[:, :, rows] += gq
                dkv[0][:, :, j * n:(j + 1) * n] += gk
                dkv[1][:, :, j * n:(j + 1) * n] += gv
            if t < ring.C - 1:
                ring.finish(reqs)
                kv = nxt
            dkv, reqs = ring.start_shift(dkv, tag=ring.C + t)   # on with its keys
            ring.finish(reqs)
        return dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype), None


class RingAttentionCore(Module):
    """The attention core of a context-parallel model (swapped in for ``AttentionCore``)."""

    def __init__(self, comm, kind="naive", zigzag=True, implementation=None):
        self.comm, self.kind, self.zigzag, self.implementation = comm, kind, zigzag, implementation

    def forward(self, q, k, v):
        if self.comm.size == 1:
            from minipar.nn.attention import attention_core
            return attention_core(q, k, v, self.kind, True, self.implementation)
        return RingAttention.apply(q, k, v, self)


def apply_ring(model, cp_comm, zigzag=True):
    """Make ``model`` (plain or tensor-parallel GPT) hold this rank's positions: every
    block's attention core becomes ring attention; the embedding reads the positions."""
    cfg = model.config
    model.token_positions = positions_of(cp_comm.rank, cp_comm.size, cfg.seq_len, zigzag)
    for block in model.blocks:
        core = block.attn.core
        block.attn.core = RingAttentionCore(cp_comm, core.kind, zigzag, core.implementation)
    return model
