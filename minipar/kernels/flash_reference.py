"""FlashAttention-2, tile by tile, in array code: the reference the CUDA kernels mirror.

Attention is ``O = softmax(S) V`` with ``S = Q Kᵀ · scale`` and ``scale = 1/sqrt(d)``.
Materialising S costs N² numbers per head; FlashAttention never does.  It walks
query tiles of ``block_q`` rows (outer loop) and key tiles of ``block_k`` keys
(inner loop) and keeps, per query row, three running quantities:

    m   the largest score seen so far             m' = max(m, rowmax(S_ij))
    l   the sum of exp(score - m) so far           l' = e^(m - m')·l + rowsum(P_ij)
    acc the unnormalised output Σ exp(s - m)·v     acc' = e^(m - m')·acc + P_ij V_j

with ``P_ij = exp(S_ij - m')``.  Rescaling by ``e^(m - m')`` whenever the maximum grows
is the *online softmax*: after the last tile ``O = acc / l`` exactly, and the
log-sum-exp ``L = m + log l`` is all backward needs to rebuild any tile of P:
``P_ij = exp(S_ij - L_i)``.  Backward (outer loop over key tiles, as the kernel does)
with ``D_i = rowsum(dO_i ∘ O_i)``:

    dV_j += P_ijᵀ dO_i        dP_ij = dO_i V_jᵀ        dS_ij = P_ij ∘ (dP_ij - D_i)
    dQ_i += dS_ij K_j · scale                          dK_j += dS_ijᵀ Q_i · scale

Memory is O(N·d) plus one ``block_q × block_k`` tile — never N×N.

Grouped-query attention.  k and v may have fewer heads than q: q is (B, H, Nq, d), k and
v are (B, Hkv, Nk, d) with H = G·Hkv, and query head h reads KV head h // G.  The arrays
are only *viewed* grouped — q as (B, Hkv, G, Nq, d), k and v as (B, Hkv, 1, Nk, d) — so
the products broadcast one KV head over its G query heads and K/V are never repeated in
memory.  By the chain rule the gradient of a KV head is the sum over its group:
``dK_kv = Σ_{h in group} dS_hᵀ Q_h · scale`` (likewise dV), the sum over axis G below.
G = 1 is plain multi-head attention, computed exactly as without the grouping.

Conventions.  q is (B, H, Nq, d); k and v are (B, Hkv, Nk, d).  Causal masking is
aligned to the bottom-right corner (as FlashAttention ≥ 2.1 and a KV cache do):
query i sees key j iff ``j <= i + (Nk - Nq)`` (``causal_mask``, the rule dense attention and
the model's softmax use too); with Nq == Nk that is plain ``j <= i``.
Key tiles wholly above that diagonal are skipped, not masked.  A query row that
sees no key at all (causal with Nq > Nk: the first Nq - Nk rows) gets output 0,
log-sum-exp -inf and zero gradients — never NaN.  Inputs in float64 are computed in
float64; anything else is accumulated in float32 and the output cast back.
"""
from __future__ import annotations

import math

from minipar.autograd.ops_attention import causal_mask, causal_offset
from minipar.backend import xp
from minipar.kernels.dense import dense_attention_forward


def accumulation_dtype(dtype):
    """float64 stays float64 (the ~1e-12 parity tests); everything else accumulates in fp32."""
    return xp.float64 if xp.dtype(dtype) == xp.float64 else xp.float32


def _masked_scores(q_tile, k_tile, q0, k0, scale, causal, shape):
    """S = Q_i K_jᵀ · scale for one tile pair, with -inf where the causal mask hides a key
    (``shape`` = (Nq, Nk) of the whole problem; the mask is built for this tile only)."""
    scores = q_tile @ k_tile.swapaxes(-1, -2) * scale
    rows, cols = q_tile.shape[-2], k_tile.shape[-2]
    if causal and k0 + cols - 1 > q0 + causal_offset(*shape):  # the tile crosses the diagonal
        scores = xp.where(causal_mask(*shape, q0, k0, rows, cols), scores, -xp.inf)
    return scores


def group_size(q, k):
    """G = query heads per KV head (axis -3 of q over that of k); ValueError unless whole."""
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"q has {heads} heads and k, v {kv_heads}: the query heads must be a "
                         "whole multiple of the key/value heads")
    return heads // kv_heads


def grouped_views(q, k, v):
    """q (.., H, Nq, d) as (.., Hkv, G, Nq, d) and k, v (.., Hkv, Nk, d) as (.., Hkv, 1, Nk, d):
    views, no copies; broadcasting then pairs query head h with KV head h // G."""
    group = group_size(q, k)
    kv_heads = k.shape[-3]
    q = q.reshape(q.shape[:-3] + (kv_heads, group) + q.shape[-2:])
    return q, k[..., None, :, :], v[..., None, :, :]


def _last_visible_key_end(q1, n_keys, causal, offset):
    """One past the last key any query row < q1 can see: where the inner loop stops."""
    return min(n_keys, q1 + offset) if causal else n_keys


def flash_forward_reference(q, k, v, causal=True, block_q=64, block_k=64):
    """Tiled forward pass. Returns ``(out, lse)``: out like q, lse (B, H, Nq) in the accumulation dtype."""
    q_shape = q.shape
    q, k, v = grouped_views(q, k, v)
    batch_heads, n_queries, head_dim = q.shape[:-2], q.shape[-2], q.shape[-1]
    n_keys = k.shape[-2]
    acc_dtype = accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(head_dim)
    offset = causal_offset(n_queries, n_keys)
    out = xp.empty(q.shape, dtype=q.dtype)
    lse = xp.empty(batch_heads + (n_queries,), dtype=acc_dtype)

    for q0 in range(0, n_queries, block_q):
        q1 = min(q0 + block_q, n_queries)
        q_tile = q[..., q0:q1, :].astype(acc_dtype)
        row_max = xp.full(batch_heads + (q1 - q0,), -xp.inf, dtype=acc_dtype)
        row_sum = xp.zeros(batch_heads + (q1 - q0,), dtype=acc_dtype)
        acc = xp.zeros(batch_heads + (q1 - q0, head_dim), dtype=acc_dtype)

        for k0 in range(0, _last_visible_key_end(q1, n_keys, causal, offset), block_k):
            k1 = min(k0 + block_k, n_keys)
            k_tile = k[..., k0:k1, :].astype(acc_dtype)
            v_tile = v[..., k0:k1, :].astype(acc_dtype)
            scores = _masked_scores(q_tile, k_tile, q0, k0, scale, causal, (n_queries, n_keys))
            new_max = xp.maximum(row_max, scores.max(axis=-1))
            # A row with nothing visible yet has max -inf; exponentiate against 0 instead
            # so that exp(-inf - (-inf)) = NaN never happens.
            safe_max = xp.where(new_max == -xp.inf, 0.0, new_max)
            probs = xp.exp(scores - safe_max[..., None])
            rescale = xp.exp(row_max - safe_max)
            row_sum = rescale * row_sum + probs.sum(axis=-1)
            acc = rescale[..., None] * acc + probs @ v_tile
            row_max = new_max

        seen = row_sum > 0
        out[..., q0:q1, :] = (acc / xp.where(seen, row_sum, 1.0)[..., None]).astype(q.dtype)
        lse[..., q0:q1] = xp.where(seen, row_max + xp.log(xp.where(seen, row_sum, 1.0)), -xp.inf)
    return out.reshape(q_shape), lse.reshape(q_shape[:-1])


def flash_backward_reference(q, k, v, out, lse, grad_out, causal=True, block_q=64, block_k=64):
    """Tiled backward from the saved log-sum-exp. Returns ``(dq, dk, dv)`` in q's dtype;
    dk, dv have k's shape (each KV head's gradient summed over its group of query heads)."""
    q_shape, kv_shape = q.shape, k.shape
    q, k, v = grouped_views(q, k, v)
    out, grad_out, lse = out.reshape(q.shape), grad_out.reshape(q.shape), lse.reshape(q.shape[:-1])
    n_queries, head_dim = q.shape[-2], q.shape[-1]
    n_keys = k.shape[-2]
    acc_dtype = accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(head_dim)
    offset = causal_offset(n_queries, n_keys)
    # D_i = rowsum(dO_i ∘ O_i) equals Σ_j P_ij dP_ij: the softmax Jacobian's correction term.
    delta = (grad_out.astype(acc_dtype) * out.astype(acc_dtype)).sum(axis=-1)
    # Rows that see nothing have lse = -inf; every score in them is masked (-inf), so
    # any finite stand-in gives P = exp(-inf - 0) = 0 there.
    safe_lse = xp.where(lse == -xp.inf, 0.0, lse).astype(acc_dtype)
    dq = xp.zeros(q.shape, dtype=acc_dtype)
    dk = xp.empty(k.shape, dtype=q.dtype)
    dv = xp.empty(v.shape, dtype=q.dtype)

    for k0 in range(0, n_keys, block_k):
        k1 = min(k0 + block_k, n_keys)
        k_tile = k[..., k0:k1, :].astype(acc_dtype)
        v_tile = v[..., k0:k1, :].astype(acc_dtype)
        dk_acc = xp.zeros(k_tile.shape, dtype=acc_dtype)
        dv_acc = xp.zeros(v_tile.shape, dtype=acc_dtype)
        # The first query that sees key k0 is k0 - offset; tiles before it are skipped.
        first_q = max(0, k0 - offset) // block_q * block_q if causal else 0
        for q0 in range(first_q, n_queries, block_q):
            q1 = min(q0 + block_q, n_queries)
            q_tile = q[..., q0:q1, :].astype(acc_dtype)
            do_tile = grad_out[..., q0:q1, :].astype(acc_dtype)
            scores = _masked_scores(q_tile, k_tile, q0, k0, scale, causal, (n_queries, n_keys))
            probs = xp.exp(scores - safe_lse[..., q0:q1, None])
            dv_acc += (probs.swapaxes(-1, -2) @ do_tile).sum(axis=-3, keepdims=True)  # over the group
            dprobs = do_tile @ v_tile.swapaxes(-1, -2)
            dscores = probs * (dprobs - delta[..., q0:q1, None])
            dq[..., q0:q1, :] += dscores @ k_tile * scale
            dk_acc += (dscores.swapaxes(-1, -2) @ q_tile * scale).sum(axis=-3, keepdims=True)
        dk[..., k0:k1, :] = dk_acc.astype(q.dtype)
        dv[..., k0:k1, :] = dv_acc.astype(q.dtype)
    return dq.astype(q.dtype).reshape(q_shape), dk.reshape(kv_shape), dv.reshape(kv_shape)


def dense_attention(q, k, v, causal=True):
    """softmax(Q Kᵀ/sqrt(d)) V with the whole (B, H, Nq, Nk) matrix in memory: the baseline
    (``dense.dense_attention_forward``, same conventions as the tiled version)."""
    return dense_attention_forward(q, k, v, causal)[0]
