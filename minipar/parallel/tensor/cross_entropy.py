"""Cross-entropy over vocabulary-sharded logits, without ever gathering them.

Rank r holds z_r = logits[..., start_r:end_r].  For one row with target y:

    m   = max_r max(z_r)                      all-reduce (max)
    S   = Σ_r Σ_j exp(z_r[j] - m)              ┐ one all-reduce (sum) of
    z_y = Σ_r (z_r[y - start_r] if y ∈ r else 0) ┘ the pair (S, z_y)
    loss = mean over counted rows of  m + log S - z_y

Each rank moves 3 numbers per row instead of V/t: for GPT-2's 50k vocabulary that is
the difference between a few KB and the largest activation of the model.  Backward is
local — the softmax of my columns is exp(z_r - m)/S, and only the owner of y subtracts 1:

    dz_r = (exp(z_r - m)/S - onehot_r(y)) · dloss / count

Rows whose target is ``ignore_index`` count for nothing (as ``ops.cross_entropy``).  A padded
vocabulary (``nn/gpt.py``): my columns of ids >= V are set to -inf first, so they are in
no max, no S and no gradient; a rank may hold padding only.
"""
from __future__ import annotations

from minipar.backend import to_device, wide_dtype, widened, xp
from minipar.autograd import ops
from minipar.autograd.function import Function
from minipar.parallel.tensor.regions import all_reduce_inplace


class VocabParallelCrossEntropy(Function):
    @staticmethod
    def forward(ctx, logits, targets, comm=None, vocab_start=0, ignore_index=-100,
                vocab_size=None):
        n_local = logits.shape[-1]
        z = widened(logits.reshape(-1, n_local))   # statistics of half logits in float32
        real = n_local if vocab_size is None else min(max(vocab_size - vocab_start, 0), n_local)
        if real < n_local:         # a padded vocabulary's rows: in no max, no sum, no gradient
            z = xp.where(xp.arange(n_local) < real, z, -xp.inf)
        t = targets.reshape(-1)
        keep = t != ignore_index
        local_t = t - vocab_start
        mine = keep & (local_t >= 0) & (local_t < n_local)
        safe_t = xp.where(mine, local_t, 0)
        rows = xp.arange(z.shape[0])

        m = z.max(axis=-1)
        all_reduce_inplace(comm, m, op="max")
        e = xp.exp(z - m[:, None])
        stats = xp.stack([e.sum(axis=-1), xp.where(mine, z[rows, safe_t], 0)])
        all_reduce_inplace(comm, stats)
        sum_e, picked = stats[0], stats[1]

        count = max(int(keep.sum()), 1)
        loss = ((m + xp.log(sum_e) - picked) * keep).sum() / count
        ctx.save_for_backward(e, sum_e)
        ctx.args = (safe_t, mine, keep, count, logits.shape, logits.dtype)
        return xp.asarray(loss, dtype=wide_dtype(logits.dtype))

    @staticmethod
    def backward(ctx, g):
        e, sum_e = ctx.saved
        safe_t, mine, keep, count, shape, dtype = ctx.args
        grad = e / sum_e[:, None]
        rows = xp.arange(grad.shape[0])
        grad[rows[mine], safe_t[mine]] -= 1
        grad *= (keep[:, None] * (g / count)).astype(grad.dtype)
        return grad.reshape(shape).astype(dtype), None


def vocab_parallel_cross_entropy(logits, targets, comm, vocab_start, ignore_index=-100,
                                 vocab_size=None):
    """Mean cross-entropy of vocabulary-sharded ``logits`` (B, N, V_r); the same scalar
    on every tp rank.  ``vocab_start``: the first vocabulary id of my shard;
    ``vocab_size``: the real V of a padded vocabulary (ids >= V are masked out)."""
    return VocabParallelCrossEntropy.apply(logits, to_device(ops.raw(targets)), comm=comm,
                                           vocab_start=vocab_start, ignore_index=ignore_index,
                                           vocab_size=vocab_size)
