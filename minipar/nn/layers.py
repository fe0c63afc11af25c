"""The basic layers: Linear, Embedding, LayerNorm, Dropout, MLP.

Weights are drawn on the host from a NumPy ``Generator`` passed in by the model,
in a fixed order, then moved to the backend: the same seed gives the same model
on NumPy and CuPy, and on one rank or many (parallel layouts slice it).
"""
from __future__ import annotations

import numpy as np

from minipar.backend import to_device, default_dtype
from minipar.autograd import ops
from minipar.nn.module import Module, Parameter


def normal(rng, shape, std, dtype=None):
    return Parameter(to_device(rng.normal(0.0, std, size=shape), dtype=dtype or default_dtype()))


def constant(value, shape, dtype=None):
    return Parameter(to_device(np.full(shape, value), dtype=dtype or default_dtype()))


class Linear(Module):
    """y = x @ W + b, with W of shape (in_features, out_features)."""

    def __init__(self, in_features, out_features, rng, bias=True, std=0.02):
        self.weight = normal(rng, (in_features, out_features), std)
        self.bias = constant(0.0, (out_features,)) if bias else None

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)


class Embedding(Module):
    """A lookup table: row ``i`` of the weight is the vector of id ``i``."""

    def __init__(self, num_embeddings, dim, rng, std=0.02):
        self.weight = normal(rng, (num_embeddings, dim), std)

    def forward(self, ids):
        return ops.embedding(self.weight, ids)


class LayerNorm(Module):
    def __init__(self, dim, eps=1e-5):
        self.weight = constant(1.0, (dim,))
        self.bias = constant(0.0, (dim,))
        self.eps = eps

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
