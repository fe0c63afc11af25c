"""Initial weights that depend on (seed, parameter name) only.

A model drawn from one generator in construction order gets weights that depend on
the order: a rank that skips the blocks of other pipeline stages, or builds only its
slice of a tensor-parallel layer, would draw different numbers.  So each parameter
gets a generator of its own, keyed by the run's seed and a stable hash of its global
name (``blocks.3.mlp.fc.weight``):

    key(seed, name) = (seed, the first four 32-bit words of sha256(name))
    W[name]         = Generator(PCG64(SeedSequence(key))).normal(0, std, global shape)

sha256 is the same in every process and Python version (Python's ``hash()`` of a
string is salted per process, so it would break parity between ranks).  So any layout
builds exactly the single-process weights, one tensor (or one slice of it) at a time,
in any order:  ``W_local = placement.local(initial_value(seed, name, shape, spec))``.
(A rank draws the whole tensor and keeps its part: t× the random numbers under tensor
parallelism, bought for exact parity with no layout-dependent stream.)

A layer built with ``rng=None`` does not draw: its weight is a *placeholder* — a
read-only broadcast view of one zero, with the right shape and dtype and no memory —
and the layer records how the weight is drawn in ``inits`` ({attribute: Normal |
Constant}).  ``initialise(model, drawer(seed, init_specs(model)))`` fills every
placeholder from its name; a parallel layout passes a ``draw`` that keeps only its part.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from minipar.backend import default_dtype, memory, to_device


@dataclass(frozen=True)
class Normal:
    """Values ~ N(0, std²)."""
    std: float

    def draw(self, rng, shape):
        return rng.normal(0.0, self.std, size=shape)


@dataclass(frozen=True)
class Constant:
    """Every value equal to ``value`` (biases 0, LayerNorm gains 1)."""
    value: float

    def draw(self, rng, shape):
        return np.full(shape, self.value, dtype=np.float64)


@dataclass(frozen=True)
class ZeroPadded:
    """``spec`` drawn over the first ``size`` entries along ``axis``, zeros after (a
    padded vocabulary: the real rows are exactly the unpadded model's, same generator)."""
    spec: object
    size: int
    axis: int = 0

    def draw(self, rng, shape):
        real = list(shape)
        real[self.axis] = self.size
        value = np.zeros(shape, dtype=np.float64)
        index = [slice(None)] * len(shape)
        index[self.axis] = slice(0, self.size)
        value[tuple(index)] = self.spec.draw(rng, tuple(real))
        return value


def name_key(seed, name):
    """The generator key of one parameter: the seed and 128 bits of sha256(name)."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    words = [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]
    return [int(seed)] + words


def generator(seed, name):
    """A NumPy Generator private to parameter ``name`` of a run with ``seed``."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(name_key(seed, name))))


class InitStats:
    """The largest full tensor drawn so far (elements): construction's host peak for
    weights is this one tensor plus what the rank keeps.  Tests read it."""
    largest = 0

    @classmethod
    def reset(cls):
        cls.largest = 0


def initial_value(seed, name, shape, spec):
    """The full host array (float64) of parameter ``name``: a pure function of its
    arguments.  Slice it to the part a rank owns; never keep it."""
    shape = tuple(shape)
    value = spec.draw(generator(seed, name), shape)
    InitStats.largest = max(InitStats.largest, value.size)
    return value


# ---------------------------------------------------------------- placeholders

def placeholder(shape, dtype=None):
    """A weight not made yet: the right shape and dtype, zero bytes, read-only."""
    return np.broadcast_to(np.zeros((), dtype=dtype or default_dtype()), tuple(shape))


def is_placeholder(array):
    """True for arrays made by ``placeholder`` (read-only, every stride 0)."""
    return (isinstance(array, np.ndarray) and array.size > 0 and not array.flags.writeable
            and all(s == 0 for s in array.strides))


def _named_modules(module, prefix=""):
    yield prefix, module
    for name, child in module.children():
        yield from _named_modules(child, prefix + name + ".")


def init_specs(model):
    """{global parameter name: (shape, Normal | Constant)} of every parameter whose layer
    says how it is drawn (its ``inits``).  Read from the plain model, before any layout
    cuts it: these are the global shapes."""
    specs = {}
    for prefix, module in _named_modules(model):
        for attr, spec in getattr(module, "inits", {}).items():
            p = getattr(module, attr, None)
            if p is not None:
                specs[prefix + attr] = (tuple(p.shape), spec)
    return specs


def drawer(seed, specs):
    """name -> the full initial array of that parameter (``specs``: see ``init_specs``)."""
    def draw(name):
        shape, spec = specs[name]
        return initial_value(seed, name, shape, spec)
    return draw


def initialise(model, draw):
    """Fill every placeholder of ``model`` with ``draw(name)`` — the full array from
    ``drawer``, or a layout's part of it — one parameter at a time."""
    for name, p in model.named_parameters():
        if is_placeholder(p.data):
            p.data = memory.track(to_device(np.ascontiguousarray(draw(name)), dtype=p.dtype))
    return model


def is_unmade(model):
    """True when some weight of ``model`` is still a placeholder."""
    return any(is_placeholder(p.data) for p in model.parameters())
