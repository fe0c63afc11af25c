"""Solutions of lesson 02's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "to_bf16": r'''
def to_bf16(x):
    """float32 array -> float32 array of the nearest bfloat16 values (ties to even)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    last_kept = (bits >> 16) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + last_kept) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)
''',
    "activation_bytes": r'''
def activation_bytes(B, N, L, d, H, V):
    """Bytes a float32 training forward keeps alive: B sequences of N tokens, L blocks."""
    per_token = L * (25 * d + 2 * H * N + 2) + 2 * d + (2 * d + 1) + (V + V + 1)
    return 4 * (B * N * per_token + N * d) + 4
''',
}
