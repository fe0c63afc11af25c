"""Module and Parameter: the containers a model is built from.

A ``Parameter`` is a leaf Tensor that requires a gradient.  A ``Module`` finds
its parameters and sub-modules by looking at its own attributes (in the order
they were set, so names and order are deterministic), which is what lets a
state dict, an optimizer, a data-parallel wrapper or a pipeline partitioner walk
any model without being told its structure.
"""
from __future__ import annotations

from collections import OrderedDict

from minipar.backend import memory, to_host, to_device
from minipar.autograd import Tensor
from minipar.nn.init import is_placeholder


class Parameter(Tensor):
    """A trainable leaf tensor."""

    __slots__ = ()

    def __init__(self, data, name=None):
        super().__init__(data, requires_grad=True, name=name)


class Module:
    training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def children(self):
        """(name, sub-module) pairs, following lists of modules too."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_parameters(self, prefix=""):
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.children():
            yield from child.named_parameters(prefix + name + ".")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def train(self, mode=True):
        self.training = mode
        for _, child in self.children():
            child.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def state_dict(self):
        """{name: host array} of every parameter (NumPy, whatever the backend)."""
        return OrderedDict((name, to_host(p.data).copy()) for name, p in self.named_parameters())

    def load_state_dict(self, state):
        """Copy arrays into the parameters; names, shapes and count must match."""
        own = dict(self.named_parameters())
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(f"state dict does not match the model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        for name, p in own.items():
            value = state[name]              # once: ``state`` may read it from disk
            if tuple(value.shape) != tuple(p.shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(value.shape)} "
                                 f"!= model shape {tuple(p.shape)}")
            if is_placeholder(p.data):       # not drawn yet (nn/init.py): take these
                p.data = memory.track(to_device(value, dtype=p.dtype))
            else:
                p.data[...] = to_device(value, dtype=p.dtype)

    def num_parameters(self):
        return sum(p.size for p in self.parameters())


class Wrapper(Module):
    """A module that adds behaviour around ``inner`` and keeps its parameter names.

    Parallelism and recomputation wrap a plain model's parts instead of patching their
    methods: ``Recompute(block)`` or a ZeRO-3 unit is a ``Wrapper``, so the optimizer,
    the checkpoints and the norm see ``blocks.0.attn.qkv.weight`` whatever wraps it,
    and removing the wrapper gives back the untouched module (``unwrap``).
    """

    def __init__(self, inner):
        self.inner = inner

    def named_parameters(self, prefix=""):
        yield from self.inner.named_parameters(prefix)

    def __getattr__(self, name):          # config, flops_per_token, ... of what is inside
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def unwrap(module):
    """The module inside every ``Wrapper`` layer."""
    while isinstance(module, Wrapper):
        module = module.inner
    return module

