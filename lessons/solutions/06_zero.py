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
}
