"""Solutions of lesson 03's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "my_block_forward": r'''
def my_block_forward(block, x):
    """One pre-LN GPT block on x (B, N, d), built from minipar's ops and block's parameters:
    x + attention(LN_1(x)), then that + MLP(LN_2(that))."""
    B, N, d = x.shape
    H = block.attn.n_head
    d_head = d // H

    def layer_norm(t, ln):
        mean = ops.mean(t, axis=-1, keepdims=True)
        centred = t - mean
        variance = ops.mean(centred * centred, axis=-1, keepdims=True)
        return centred / ops.pow(variance + ln.eps, 0.5) * ln.weight + ln.bias

    def linear(t, layer):
        return t @ layer.weight + layer.bias

    qkv = linear(layer_norm(x, block.ln_1), block.attn.qkv)               # (B, N, 3d)
    heads = ops.transpose(ops.reshape(qkv, (B, N, 3, H, d_head)), (2, 0, 3, 1, 4))
    q, k, v = heads[0], heads[1], heads[2]                                # (B, H, N, d_head)
    scores = q @ ops.transpose(k, (0, 1, 3, 2)) / math.sqrt(d_head)
    future = np.triu(np.ones((N, N), dtype=bool), k=1)                    # s > t
    probs = ops.softmax(ops.masked_fill(scores, future, -np.inf))
    y = ops.reshape(ops.transpose(probs @ v, (0, 2, 1, 3)), (B, N, d))    # heads side by side
    x = x + linear(y, block.attn.proj)
    hidden = ops.gelu(linear(layer_norm(x, block.ln_2), block.mlp.fc))
    return x + linear(hidden, block.mlp.proj)
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
