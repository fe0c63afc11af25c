"""Solutions of lesson 19's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "swiglu_share": r'''
def my_swiglu_share(x, w_gate, w_up, w_down, rank, tp):
    """This rank's part of down(silu(x W_gate) * x W_up): its run of neurons, the same
    columns of gate and up, the same rows of down."""
    width = w_gate.shape[1]
    neurons = slice(rank * width // tp, (rank + 1) * width // tp)
    gate = x @ w_gate[:, neurons]
    return (gate / (1 + np.exp(-gate)) * (x @ w_up[:, neurons])) @ w_down[neurons]
''',
    "cp_attention": r'''
%%writefile {MINE}/cp_attention.py
"""Your RoPE and grouped-query attention on a context-parallel rank (lesson 19):
checked in the notebook and by 19_yours.py under mpiexec."""
import numpy as np

from minipar.comm import all_gather


def my_rope(x, positions, base=10000.0):
    """x (..., n, d) rotated plane by plane: plane i = features (i, i + d/2), angle m·base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)                          # (d/2,)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * theta   # (n, d/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-b, a], axis=-1) * sin


def my_cp_attention(comm, q, k, v, positions, base=10000.0):
    """Causal attention of this rank's queries over the whole sequence: q, k rotated at their
    true positions, the H_kv heads of K and V gathered, query head h reading KV head h // G."""
    cp, r = comm.size, comm.rank
    b, h, n, d = q.shape
    h_kv = k.shape[1]
    q, k = my_rope(q, positions[r], base), my_rope(k, positions[r], base)
    mine = np.ascontiguousarray(np.stack([k, v]))                       # (2, B, H_kv, n, d): one message
    every = np.asarray(all_gather(comm, mine)).reshape((cp,) + mine.shape)
    keys, values = (every[:, i].transpose(1, 2, 0, 3, 4).reshape(b, h_kv, cp * n, d) for i in (0, 1))
    key_positions = np.concatenate(positions)                           # in the same rank order
    grouped = q.reshape(b, h_kv, h // h_kv, n, d)                       # (B, H_kv, G, n, d)
    scores = grouped @ keys[:, :, None].swapaxes(-1, -2) / np.sqrt(d)  # (B, H_kv, G, n, cp·n)
    scores = np.where(key_positions[None, :] <= positions[r][:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out = (p / p.sum(axis=-1, keepdims=True)) @ values[:, :, None]     # (B, H_kv, G, n, d)
    return out.reshape(b, h, n, d)
''',
}
