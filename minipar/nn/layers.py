"""The basic layers: Linear, Embedding, LayerNorm, Dropout, MLP.

Weights are drawn on the host, then moved to the backend, so the same seed gives the
same weights on NumPy and CuPy.  A layer given a NumPy ``Generator`` draws from it at
once, in construction order (handy for a layer on its own).  Given ``rng=None`` it
draws nothing: its weights are placeholders, and ``inits`` says how each is drawn, so
``minipar.nn.init`` can make them later from (seed, parameter name) — the GPT is built
that way, which lets every layout build only its own part (see ``nn/init.py``).
"""
from __future__ import annotations

import numpy as np

from minipar.backend import to_device, default_dtype
from minipar.autograd import ops
from minipar.nn.init import Constant, Normal, placeholder
from minipar.nn.module import Module, Parameter


def normal(rng, shape, std, dtype=None):
    """N(0, std²) weights drawn from ``rng`` now, or a placeholder when ``rng`` is None."""
    if rng is None:
        return Parameter(placeholder(shape, dtype))
    return Parameter(to_device(rng.normal(0.0, std, size=shape), dtype=dtype or default_dtype()))


def constant(value, shape, dtype=None, deferred=False):
    if deferred:
        return Parameter(placeholder(shape, dtype))
    return Parameter(to_device(np.full(shape, value), dtype=dtype or default_dtype()))


class Linear(Module):
    """y = x @ W + b, with W of shape (in_features, out_features)."""

    def __init__(self, in_features, out_features, rng, bias=True, std=0.02):
        self.weight = normal(rng, (in_features, out_features), std)
        self.bias = constant(0.0, (out_features,), deferred=rng is None) if bias else None
        self.inits = {"weight": Normal(std), "bias": Constant(0.0)}

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A lookup table: row ``i`` of the weight is the vector of id ``i``."""

    def __init__(self, num_embeddings, dim, rng, std=0.02):
        self.weight = normal(rng, (num_embeddings, dim), std)
        self.inits = {"weight": Normal(std)}

    def forward(self, ids):
        return ops.embedding(self.weight, ids)


class LayerNorm(Module):
    def __init__(self, dim, eps=1e-5):
        self.weight = constant(1.0, (dim,))
        self.bias = constant(0.0, (dim,))
        self.eps = eps
        self.inits = {"weight": Constant(1.0), "bias": Constant(0.0)}

    def forward(self, x):
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Dropout whose masks come from ``generator`` (an ``xp.random`` Generator held
    by the model), so recomputation can restore its state and replay them."""

    def __init__(self, p, generator):
        self.p = p
        self.generator = generator

    def forward(self, x):
        return ops.dropout(x, self.p, self.generator, self.training)


class MLP(Module):
    """fc (d -> 4d), GELU, proj (4d -> d), dropout."""

    def __init__(self, d_model, rng, proj_std, dropout):
        self.fc = Linear(d_model, 4 * d_model, rng)
        self.proj = Linear(4 * d_model, d_model, rng, std=proj_std)
        self.drop = dropout

    def forward(self, x):
        return self.drop(self.proj(ops.gelu(self.fc(x))))
