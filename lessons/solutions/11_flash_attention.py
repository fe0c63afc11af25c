"""Solutions of lesson 11's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "my_flash_forward": r'''
def my_flash_forward(q, k, v, causal=False, block_k=32):
    """softmax(q kᵀ/sqrt(d), causal) v over key tiles of block_k keys, every query row at once.
    q, k, v: (B, H, N, d). Returns (out (B, H, N, d), lse (B, H, N))."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    m = np.full(q.shape[:-1], -np.inf)      # running max of each query row
    l = np.zeros(q.shape[:-1])              # running sum of exp(s - m)
    acc = np.zeros(q.shape)                 # running sum of exp(s - m) · v
    rows = np.arange(n)[:, None]
    for k0 in range(0, n, block_k):
        k_tile, v_tile = k[..., k0:k0 + block_k, :], v[..., k0:k0 + block_k, :]
        s = q @ k_tile.swapaxes(-1, -2) * scale                 # (B, H, N, block_k): one tile
        if causal:
            cols = np.arange(k0, k0 + k_tile.shape[-2])[None, :]
            s = np.where(cols > rows, -np.inf, s)
        m_new = np.maximum(m, s.max(axis=-1))
        p = np.exp(s - m_new[..., None])
        rescale = np.exp(m - m_new)                             # 0 on the first tile (m = -inf)
        l = rescale * l + p.sum(axis=-1)
        acc = rescale[..., None] * acc + p @ v_tile
        m = m_new
    return acc / l[..., None], m + np.log(l)
''',
    "my_attention_backward": r'''
def my_attention_backward(q, k, v, out, lse, dout, causal=False):
    """(dq, dk, dv) of O = softmax(q kᵀ/sqrt(d), causal) v, from the saved out and lse."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    if causal:
        s = np.where(np.triu(np.ones((n, k.shape[-2]), bool), 1), -np.inf, s)
    p = np.exp(s - lse[..., None])                  # the probabilities, rebuilt from L
    delta = (dout * out).sum(axis=-1)               # D_i = rowsum(dO ∘ O)
    dv = p.swapaxes(-1, -2) @ dout
    dp = dout @ v.swapaxes(-1, -2)
    ds = p * (dp - delta[..., None])
    return ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, dv
''',
}
