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
    "my_flash_backward": r'''
def my_flash_backward(q, k, v, out, lse, dout, causal=False, block_q=32, block_k=32):
    """(dq, dk, dv, tiles) of O = softmax(q kᵀ/sqrt(d), causal) v, from the saved out and lse,
    over tiles of block_q queries × block_k keys; tiles: how many tiles were computed."""
    n, scale = q.shape[-2], 1 / math.sqrt(q.shape[-1])
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    delta = (dout * out).sum(axis=-1)                   # D_i = rowsum(dO ∘ O), once
    tiles = 0
    for k0 in range(0, n, block_k):                     # outer: one key tile, its dK and dV private
        k1 = min(k0 + block_k, n)
        k_j, v_j = k[..., k0:k1, :], v[..., k0:k1, :]
        dk_j, dv_j = np.zeros(k_j.shape), np.zeros(v_j.shape)
        for q0 in range(0, n, block_q):                 # inner: the query tiles that see it
            q1 = min(q0 + block_q, n)
            if causal and k0 > q1 - 1:                  # every key after every query: skipped
                continue
            tiles += 1
            q_i, do_i = q[..., q0:q1, :], dout[..., q0:q1, :]
            s = q_i @ k_j.swapaxes(-1, -2) * scale
            if causal:
                s = np.where(np.arange(k0, k1)[None, :] > np.arange(q0, q1)[:, None], -np.inf, s)
            p = np.exp(s - lse[..., q0:q1, None])       # this tile of P, rebuilt from L
            dv_j += p.swapaxes(-1, -2) @ do_i
            dp = do_i @ v_j.swapaxes(-1, -2)
            ds = p * (dp - delta[..., q0:q1, None])
            dq[..., q0:q1, :] += ds @ k_j * scale
            dk_j += ds.swapaxes(-1, -2) @ q_i * scale
        dk[..., k0:k1, :], dv[..., k0:k1, :] = dk_j, dv_j
    return dq, dk, dv, tiles
''',
}
