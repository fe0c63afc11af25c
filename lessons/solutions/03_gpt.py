"""Solutions of lesson 03's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "causal_attention": r'''
def causal_attention(q, k, v):
    """softmax(q kᵀ / sqrt(d_h) + causal mask) v for arrays of shape (..., N, d_h)."""
    n = q.shape[-2]
    S = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    S = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, S)
    P = np.exp(S - S.max(axis=-1, keepdims=True))
    P /= P.sum(axis=-1, keepdims=True)
    return P @ v
''',
    "adamw_step": r'''
def adamw_step(p, g, m, v, t, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0):
    """One AdamW step on arrays, in place on p, m and v; t counts from 1."""
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * g * g
    m_hat = m / (1 - beta1 ** t)
    v_hat = v / (1 - beta2 ** t)
    p -= lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p)
''',
}
