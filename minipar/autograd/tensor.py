"""Tensor: an array of the selected backend, plus what autograd needs.

- ``data``: the NumPy or CuPy array;
- ``requires_grad``: whether gradients flow to (or through) it;
- ``grad``: the accumulated dL/d(this) for leaves, after ``backward``;
- ``ctx``: the graph node of the Function that made it (None for leaves);
- ``hooks``: callables fired with the tensor each time a gradient is accumulated
  into a leaf's ``grad`` (PyTorch's post-accumulate-grad hooks).

Arithmetic operators and methods forward to the Functions in ``ops*.py``.
"""
from __future__ import annotations

from minipar.backend import xp, memory, to_host
from minipar.autograd import engine


class Tensor:
    __slots__ = ("data", "requires_grad", "grad", "ctx", "hooks", "name", "__weakref__")
    __array_priority__ = 1000  # make ndarray * Tensor defer to Tensor.__rmul__

    def __init__(self, data, requires_grad=False, dtype=None, name=None):
        if isinstance(data, Tensor):
            data = data.data
        if dtype is not None or not hasattr(data, "dtype"):
            data = xp.asarray(data, dtype=dtype)
        self.data = memory.track(data)
        self.requires_grad = requires_grad
        self.grad = None
        self.ctx = None
        self.hooks = []
        self.name = name

    # ------------------------------------------------------------ basics
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{grad})"

    def numpy(self):
        """The values as a NumPy array (copied to the host from a GPU)."""
        return to_host(self.data)

    def item(self):
        return to_host(self.data).item()

    def detach(self):
        """The same values, cut from the graph (shares memory)."""
        return Tensor(self.data)

    def zero_grad(self):
        self.grad = None

    def register_hook(self, hook):
        """Call ``hook(tensor)`` after each gradient accumulation into this leaf."""
        self.hooks.append(hook)
        return hook

    def backward(self, grad=None, retain_graph=False, deferral=None):
        """Back-propagate from this tensor.

        With no ``grad`` the tensor must be a scalar loss (dL/dL = 1); a pipeline
        stage passes the gradient it received from the next stage instead.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError("backward() without a gradient needs a scalar; pass grad=")
            grad = xp.ones_like(self.data)
        elif isinstance(grad, Tensor):
            grad = grad.data
        if grad.shape != self.shape:
            raise ValueError(f"gradient shape {grad.shape} != tensor shape {self.shape}")
        engine.backward(self, grad, retain_graph=retain_graph, deferral=deferral)

    # ------------------------------------------------------------ operators
    def __add__(self, other): return ops.add(self, other)
    def __radd__(self, other): return ops.add(other, self)
    def __sub__(self, other): return ops.sub(self, other)
    def __rsub__(self, other): return ops.sub(other, self)
    def __mul__(self, other): return ops.mul(self, other)
    def __rmul__(self, other): return ops.mul(other, self)
    def __truediv__(self, other): return ops.div(self, other)
    def __rtruediv__(self, other): return ops.div(other, self)
    def __neg__(self): return ops.neg(self)
    def __pow__(self, exponent): return ops.pow(self, exponent)
    def __matmul__(self, other): return ops.matmul(self, other)
    def __rmatmul__(self, other): return ops.matmul(other, self)
    def __getitem__(self, index): return ops.getitem(self, index)

    def exp(self): return ops.exp(self)
    def log(self): return ops.log(self)
    def tanh(self): return ops.tanh(self)
    def relu(self): return ops.relu(self)
    def gelu(self): return ops.gelu(self)
    def sum(self, axis=None, keepdims=False): return ops.sum(self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return ops.mean(self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return ops.max(self, axis, keepdims)
    def softmax(self, axis=-1): return ops.softmax(self, axis)
    def log_softmax(self, axis=-1): return ops.log_softmax(self, axis)
    def astype(self, dtype): return ops.cast(self, dtype)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.reshape(self, shape)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.transpose(self, axes or None)

    @property
    def T(self):
        return ops.transpose(self, None)


def tensor(data, requires_grad=False, dtype=None):
    """Make a Tensor; float inputs get the default dtype unless ``dtype`` is given."""
    from minipar.backend import default_dtype
    if dtype is None and not hasattr(data, "dtype"):
        probe = xp.asarray(data)
        dtype = default_dtype() if probe.dtype.kind == "f" else None
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


from minipar.autograd import ops  # noqa: E402  (ops import Tensor; bound after the class)
