"""The backward engine: the chain rule applied to the recorded graph.

Every Tensor made by a Function remembers its ``ctx`` (the op and its inputs).
``backward(root, grad)`` orders the nodes reachable from ``root`` so that a node
comes after every node that uses its output (reverse topological order), then
walks them once:

    dL/d(input_i) += fn.backward(ctx, dL/d(output))[i]

A gradient reaching a leaf (a Tensor with ``requires_grad`` and no ``ctx``,
i.e. a parameter or a pipeline stage's received activation) is accumulated into
``leaf.grad`` and the leaf's hooks fire; data-parallel bucketing and ZeRO are
built on those hooks.  The walk frees each node's saved arrays as soon as it is
used, which is what keeps backward's memory falling as it goes.
"""
from __future__ import annotations

from minipar.backend import memory
from minipar.autograd.function import set_grad_enabled


def _topological_order(root):
    """Non-leaf tensors reachable from root, each before the tensors it was made from."""
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        tensor, expanded = stack.pop()
        if expanded:
            order.append(tensor)
            continue
        if id(tensor) in visited or tensor.ctx is None:
            continue
        visited.add(id(tensor))
        stack.append((tensor, True))
        for parent in tensor.ctx.inputs:
            if getattr(parent, "requires_grad", False) and parent.ctx is not None \
                    and id(parent) not in visited:
                stack.append((parent, False))
    order.reverse()
    return order


def accumulate_leaf_grad(leaf, grad):
    """leaf.grad += grad, then fire the leaf's hooks (gradient-ready events)."""
    if grad.dtype != leaf.data.dtype:
        grad = grad.astype(leaf.data.dtype)
    if leaf.grad is None:
        leaf.grad = memory.track(grad.copy() if grad.base is not None else grad)
    else:
        leaf.grad += grad
    for hook in leaf.hooks:
        hook(leaf)


def backward(root, grad, retain_graph=False):
    """Propagate ``grad`` (dL/d(root)) to every leaf that requires a gradient."""
    grads = {id(root): grad}
    if root.ctx is None:
        accumulate_leaf_grad(root, grad)
        return
    with set_grad_enabled(False):
        for tensor in _topological_order(root):
            out_grad = grads.pop(id(tensor), None)
            if out_grad is None:
                continue
            ctx = tensor.ctx
            in_grads = ctx.fn.backward(ctx, out_grad)
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            for parent, g, needed in zip(ctx.inputs, in_grads, ctx.needs_input_grad):
                if not needed or g is None:
                    continue
                if parent.ctx is None:
                    accumulate_leaf_grad(parent, g)
                elif id(parent) in grads:
                    grads[id(parent)] = grads[id(parent)] + g
                else:
                    grads[id(parent)] = g
            if not retain_graph:
                ctx.release()
                tensor.ctx = None
