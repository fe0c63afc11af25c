"""The backward engine: the chain rule applied to the recorded graph.

Every Tensor made by a Function remembers its ``ctx`` (the op and its inputs).
``backward(root, grad)`` orders the nodes reachable from ``root`` so that a node
comes after every node that uses its output (reverse topological order), then
walks them once:

    dL/d(input_i) += fn.backward(ctx, dL/d(output))[i]

A leaf (a Tensor with ``requires_grad`` and no ``ctx``: a parameter, or a
pipeline stage's received activation) may be used several times in the graph;
its contributions are summed first and, once its last use has been processed,
added to ``leaf.grad`` in one go and the leaf's hooks fire — once per backward,
which is the "gradient ready" event data-parallel bucketing and ZeRO are built on.  The walk frees each node's saved arrays as soon as it is
used, which is what keeps backward's memory falling as it goes.
"""
from __future__ import annotations

from minipar.backend import memory, xp
from minipar.autograd import function
from minipar.autograd.function import set_grad_enabled


def _topological_order(root):
    """Non-leaf tensors reachable from root, each before the tensors it was made from,
    and the number of graph edges into each leaf (how many gradients it will get)."""
    order, visited, leaf_uses = [], set(), {}
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
        for parent, needed in zip(tensor.ctx.inputs, tensor.ctx.needs_input_grad):
            if not needed:
                continue
            if parent.ctx is None:
                leaf_uses[id(parent)] = leaf_uses.get(id(parent), 0) + 1
            elif id(parent) not in visited:
                stack.append((parent, False))
    order.reverse()
    return order, leaf_uses


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


def _leaf_edge_done(leaf, g, grads, leaf_uses):
    """One of the leaf's uses delivered ``g`` (or None); accumulate after the last."""
    key = id(leaf)
    if g is not None:
        grads[key] = g if key not in grads else grads[key] + g
    leaf_uses[key] -= 1
    if leaf_uses[key] == 0:
        total = grads.pop(key, None)
        if total is not None:
            accumulate_leaf_grad(leaf, total)


def backward(root, grad, retain_graph=False, deferral=None):
    """Propagate ``grad`` (dL/d(root)) to every leaf that requires a gradient.

    ``deferral``: a ``WeightGradDeferral`` handed to every node as ``ctx.deferral``, so
    ops that can postpone work (a linear layer's dW) queue it there; None computes all."""
    grads = {id(root): grad}
    if root.ctx is None:
        accumulate_leaf_grad(root, grad)
        return
    order, leaf_uses = _topological_order(root)
    owned = set()      # keys of grads whose array the engine made itself: safe to add into
    with set_grad_enabled(False):
        for tensor in order:
            out_grad = grads.pop(id(tensor), None)
            owned.discard(id(tensor))          # handed to an op now: it may keep or return it
            ctx = tensor.ctx
            if out_grad is None:   # no gradient reached this node: its leaf edges deliver none
                for parent, needed in zip(ctx.inputs, ctx.needs_input_grad):
                    if needed and parent.ctx is None:
                        _leaf_edge_done(parent, None, grads, leaf_uses)
                continue
            ctx.deferral = deferral
            if (hasattr(ctx.fn, "backward_into") and ctx.needs_input_grad[0]
                    and ctx.inputs[0].ctx is not None):    # a slice of a computed tensor
                _scatter(ctx, out_grad, grads, owned, id(ctx.inputs[0]))
                in_grads = ()
            elif function._op_observer is None:
                in_grads = ctx.fn.backward(ctx, out_grad)
            else:                               # the profiler: it calls and times it
                in_grads = function._op_observer.backward(ctx, out_grad)
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            for parent, g, needed in zip(ctx.inputs, in_grads, ctx.needs_input_grad):
                if not needed:
                    continue
                if parent.ctx is None:
                    _leaf_edge_done(parent, g, grads, leaf_uses)
                elif g is not None:
                    _accumulate(grads, owned, id(parent), g)
            if not retain_graph:
                ctx.release()
                tensor.ctx = None


def _accumulate(grads, owned, key, g):
    """grads[key] += g: in place where the engine owns grads[key] (it made the array, so
    no op holds it), else into a new array that it then owns.  The residual stream's
    gradient, summed from every block that reads it, is added into one array."""
    cur = grads.get(key)
    if cur is None:
        grads[key] = g
    elif key in owned and cur.shape == g.shape and cur.dtype == xp.result_type(cur, g):
        cur += g
    else:
        grads[key] = cur + g
        owned.add(key)


def _scatter(ctx, g, grads, owned, key):
    """An op whose input gradient is mostly zeros (a slice: ``GetItem.backward_into``)
    writes its part into the input's accumulated gradient, instead of returning a
    zero-padded copy to be summed: q, k and v, three slices of one qkv array, fill one
    gradient array where they would make three and add them."""
    observer = function._op_observer
    run = ctx.fn.backward_into if observer is None else observer.backward_into
    if key in owned:
        run(ctx, g, grads[key])
        return
    previous = grads.pop(key, None)
    grads[key] = run(ctx, g, None)
    owned.add(key)
    if previous is not None:
        _accumulate(grads, owned, key, previous)
