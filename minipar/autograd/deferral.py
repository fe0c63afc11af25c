"""Deferred weight gradients, for zero-bubble pipeline schedules (ZB-H1).

Backward of a linear layer has two parts: B, the input gradient dx = dy @ Wᵀ that
the previous stage waits for, and W, the weight gradient dW = xᵀ @ dy that nobody
waits for.  With ``d = WeightGradDeferral(); out.backward(g, deferral=d)`` the linear
layers compute only B and queue their W work in ``d`` (the engine hands ``d`` to every
node as ``ctx.deferral``: no global state); ``d.run()`` later computes
the queued weight gradients and accumulates them into the parameters (firing
their hooks), filling what would otherwise be pipeline bubbles.
"""
from __future__ import annotations

from minipar.autograd.engine import accumulate_leaf_grad, backward
from minipar.autograd.function import set_grad_enabled


class WeightGradDeferral:
    def __init__(self):
        self.pending = []   # (leaves, compute) pairs

    def defer(self, leaves, compute):
        self.pending.append((leaves, compute))

    def run(self):
        """Compute every queued weight gradient and accumulate it into its leaf."""
        with set_grad_enabled(False):
            while self.pending:
                leaves, compute = self.pending.pop(0)
                for leaf, grad in zip(leaves, compute()):
                    if grad is None or not getattr(leaf, "requires_grad", False):
                        continue
                    if leaf.ctx is None:
                        accumulate_leaf_grad(leaf, grad)
                    else:   # e.g. a weight cast to half precision: go on to the master copy
                        backward(leaf, grad)
