"""Solutions of lesson 19's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "rope": r'''
%%writefile {MINE}/rope.py
"""Your RoPE (lesson 19): checked in the notebook and by 19_yours.py under mpiexec."""
import numpy as np


def my_rope(x, positions, base=10000.0):
    """x (..., n, d) rotated plane by plane: plane i = features (i, i + d/2), angle m·base^(-2i/d)."""
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)                       # (d/2,)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * theta  # (n, d/2)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return x * cos + np.concatenate([-b, a], axis=-1) * sin
''',
    "gqa": r'''
def my_grouped_attention(q, k, v):
    """Causal attention; query head h reads KV head h // G in place (G = H / H_kv)."""
    b, h, n, d = q.shape
    h_kv = k.shape[1]
    qg = q.reshape(b, h_kv, h // h_kv, n, d)                  # (B, H_kv, G, N, d)
    kg, vg = k[:, :, None], v[:, :, None]                     # (B, H_kv, 1, N, d)
    scores = qg @ kg.swapaxes(-1, -2) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return ((p / p.sum(axis=-1, keepdims=True)) @ vg).reshape(b, h, n, d)
''',
}
