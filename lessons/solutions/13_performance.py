"""Solutions of lesson 13's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "my_flops_per_token": r'''
def my_flops_per_token(n_layer, d_model, vocab_size, seq_len, tie_weights=False):
    """Training FLOPs per token, 6N + 12·L·h·s, with N counted from the shapes (see above)."""
    h = d_model
    block = (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h) + 2 * 2 * h
    n = n_layer * block + vocab_size * h + 2 * h     # the head's matmul; the embeddings are lookups
    return 6 * n + 12 * n_layer * h * seq_len
''',
    "layer_bytes": r'''
def layer_bytes(s, b, h, a, t):
    """Activation bytes of one layer with tensor + sequence parallelism of degree t (16-bit)."""
    return s * b * h / t * (34 + 5 * a * s / h)
''',
    "ring_all_reduce_s": r'''
def ring_all_reduce_s(p, S, alpha, bw):
    """Seconds of a ring all-reduce of S bytes over p ranks (latency alpha, bandwidth bw bytes/s)."""
    return 2 * (p - 1) * (alpha + S / p / bw)
''',
}
