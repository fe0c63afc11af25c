"""Solutions of lesson 01's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "linear_backward": r'''
def linear_backward(x, W, g):
    """x: (..., d_in), W: (d_in, d_out), g = dL/dy: (..., d_out)  ->  (dx, dW, db)."""
    X = x.reshape(-1, x.shape[-1])
    G = g.reshape(-1, g.shape[-1])
    return (G @ W.T).reshape(x.shape), X.T @ G, G.sum(axis=0)
''',
    "softmax_backward": r'''
def softmax_backward(y, g):
    """y = softmax(x) along the last axis, g = dL/dy  ->  dL/dx (same shape)."""
    return y * (g - (g * y).sum(axis=-1, keepdims=True))
''',
    "unbroadcast": r'''
def unbroadcast(grad, shape):
    """Sum grad (the gradient of a broadcast result) down to the input's shape."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True).reshape(shape)
''',
}
