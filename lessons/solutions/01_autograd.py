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
    "my_backward": r'''
def my_backward(root, grad):
    """Back-propagate grad = dL/d(root) through the graph recorded under root: every leaf
    that needs a gradient gets it added to .grad, and its hooks fire once it is complete."""
    order, visited, leaf_uses = [], set(), {}

    def visit(tensor):                      # post-order: a node after everything it was made from
        visited.add(id(tensor))
        for parent, needed in zip(tensor.ctx.inputs, tensor.ctx.needs_input_grad):
            if not needed:
                continue
            if parent.ctx is None:          # a leaf: count the gradients it will receive
                leaf_uses[id(parent)] = leaf_uses.get(id(parent), 0) + 1
            elif id(parent) not in visited:
                visit(parent)
        order.append(tensor)

    visit(root)
    grads, leaf_sums = {id(root): grad}, {}
    for tensor in reversed(order):          # every consumer of a node comes before the node
        ctx = tensor.ctx
        in_grads = ctx.fn.backward(ctx, grads.pop(id(tensor)))
        if not isinstance(in_grads, tuple):
            in_grads = (in_grads,)
        for parent, g, needed in zip(ctx.inputs, in_grads, ctx.needs_input_grad):
            if not needed:
                continue
            key = id(parent)
            if parent.ctx is not None:      # an inner node: sum what its consumers send
                grads[key] = g if key not in grads else grads[key] + g
                continue
            leaf_sums[key] = g if key not in leaf_sums else leaf_sums[key] + g
            leaf_uses[key] -= 1
            if leaf_uses[key] == 0:         # its last use: the gradient is complete
                total = leaf_sums.pop(key)
                parent.grad = total if parent.grad is None else parent.grad + total
                for hook in parent.hooks:
                    hook(parent)
        ctx.release()                       # its saved arrays are no longer needed
        tensor.ctx = None
''',
}
