"""Function: one differentiable operation, and the graph node it leaves behind.

A ``Function`` subclass states the math of an op twice, on raw arrays:

    class Mul(Function):
        @staticmethod
        def forward(ctx, a, b):            # arrays in, array out
            ctx.save_for_backward(a, b)
            return a * b

        @staticmethod
        def backward(ctx, grad):           # dL/d(out) in, one dL/d(input) per input
            a, b = ctx.saved
            return grad * b, grad * a

``Mul.apply(x, y)`` unwraps Tensors to arrays, runs ``forward`` and, when a
gradient is wanted, returns a Tensor whose ``ctx`` remembers the inputs: that
``ctx`` is the node of the graph the backward engine walks.  ``backward``
returns one gradient per positional argument of ``forward`` (None where the
argument is a constant or needs no gradient; ``ctx.needs_input_grad`` says
which are wanted, so work can be skipped).
"""
from __future__ import annotations

import contextlib

from minipar.backend import memory

_grad_enabled = True
_op_observer = None   # the profiler while one is active (``minipar/observe/profiler.py``); else None


def is_grad_enabled() -> bool:
    return _grad_enabled


@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, mode
    try:
        yield
    finally:
        _grad_enabled = previous


def no_grad():
    """Context manager: ops inside build no graph (evaluation, optimizer steps)."""
    return set_grad_enabled(False)


class Context:
    """What a Function keeps between forward and backward: the graph node."""

    __slots__ = ("fn", "inputs", "needs_input_grad", "saved", "__dict__")

    def __init__(self, fn, inputs, needs_input_grad):
        self.fn = fn
        self.inputs = inputs              # the forward's positional arguments (Tensors or constants)
        self.needs_input_grad = needs_input_grad
        self.saved = ()

    def save_for_backward(self, *arrays):
        """Keep arrays for backward; they count towards activation memory."""
        for a in arrays:
            memory.track(a)
        self.saved = arrays

    def input_value(self, i):
        """The current array of forward argument ``i`` (read at backward time, so a
        parameter whose storage was freed and re-gathered, as in ZeRO-3, is seen fresh)."""
        value = self.inputs[i]
        return value.data if hasattr(value, "requires_grad") else value

    def release(self):
        """Drop saved activations once backward has used them."""
        self.saved = ()
        self.__dict__.clear()


class Function:
    """Base class of every differentiable op; see the module docstring."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        from minipar.autograd.tensor import Tensor

        arrays = [a.data if isinstance(a, Tensor) else a for a in args]
        needs = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        track = _grad_enabled and any(needs)
        ctx = Context(cls, args if track else None, needs)
        if _op_observer is None:
            out = cls.forward(ctx, *arrays, **kwargs)
        else:                                   # it calls cls.forward and times it
            out = _op_observer.forward(ctx, arrays, kwargs)
        if not track:
            return Tensor(out)
        result = Tensor(out, requires_grad=True)
        result.ctx = ctx
        return result
