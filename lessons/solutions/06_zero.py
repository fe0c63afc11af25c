"""Solutions of lesson 06's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "zero_memory": r'''
def state_bytes(stage, psi, n, padded):
    shard = padded // n                        # elements of every padded buffer this rank keeps
    if stage == 0:
        return 4 * psi, 4 * psi, 8 * psi
    if stage == 1:
        return 4 * padded, 4 * psi, 8 * shard     # weights in padded buckets, full grads
    if stage == 2:
        return 4 * padded, 4 * shard, 8 * shard
    return 4 * shard, 4 * shard, 8 * shard
''',
    "zero1_step": r'''
from minipar.optim import adamw_update

def zero1_step(weights, grads, m, v, step, lr):
    n = len(grads)
    s = len(weights) // n
    shards = []
    for r in range(n):
        mine = slice(r * s, (r + 1) * s)
        grad = np.mean([g[mine] for g in grads], axis=0)     # reduce-scatter (then / n)
        shard = weights[mine].copy()
        adamw_update(shard, grad, m[r], v[r], step, lr)       # my shard, my m and v
        shards.append(shard)
    full = np.concatenate(shards)                             # all-gather
    return [full.copy() for _ in range(n)]
''',
    "zero3_step": r'''
%%writefile {MINE}/zero3.py
"""Your ZeRO-3 step with prefetch (lesson 06): run under mpiexec by 06_yours.py."""
from minipar.backend import xp
from minipar.comm import all_gather_async, reduce_scatter


def zero3_step(comm, shards, shape, x, target):
    """Forward and backward of h <- tanh(h @ W_i), the next layer's gather in flight while a
    layer computes; returns (my rows' loss, my shard of each layer's gradient of the
    global mean loss)."""
    L = len(shards)
    hs, coming = [x], all_gather_async(comm, shards[0])
    for i in range(L):
        W = coming.wait().reshape(shape)                   # layer i's weight, gathered
        coming = all_gather_async(comm, shards[min(i + 1, L - 1)])   # prefetch: the next layer's
                                                           # (after the top, the top's again, for backward)
        hs.append(xp.tanh(hs[-1] @ W))
        del W                                              # free after use
    loss = 0.5 * float(xp.sum((hs[-1] - target) ** 2)) / len(x)
    dy, grads = (hs[-1] - target) / len(x), [None] * L
    for i in reversed(range(L)):                           # coming: layer i's gather, for backward
        W = coming.wait().reshape(shape)
        if i > 0:
            coming = all_gather_async(comm, shards[i - 1])     # prefetch the layer below
        dz = dy * (1 - hs[i + 1] ** 2)
        dW, dy = hs[i].T @ dz, dz @ W.T
        del W
        grads[i] = reduce_scatter(comm, dW.reshape(-1)) / comm.size   # my shard of the mean
    return loss, grads
''',
}
