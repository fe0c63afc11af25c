"""Rotary position embedding (RoPE, Su et al. 2021), Hugging Face Llama's layout.

A query or key vector of d features is read as d/2 planes; plane i is the pair of
features (i, i + d/2) — the "rotate_half" layout of ``LlamaForCausalLM``, not the
interleaved pairs (2i, 2i+1) of the paper.  At position m plane i turns by the angle
m·θ_i, θ_i = base^(-2i/d):

    rope(x, m) = x · cos(m·θ) + rotate_half(x) · sin(m·θ),   rotate_half([a, b]) = [-b, a]

(cos and sin repeated over both halves).  A rotation by m for the query and by n for the
key leaves their dot product a function of m - n only: relative position, with no table
of learned positions.

Context parallelism gives a rank positions that are not 0..n-1 (the zig-zag split
holds two far-apart chunks), so the angles come from the model's *true* positions:
``RotaryEmbedding.positions`` (None: 0..n-1), which the model sets for every attention
layer at once — the layers share one ``RotaryEmbedding``.  It has no parameters.
"""
from __future__ import annotations

import numpy as np

from minipar.autograd import ops
from minipar.backend import to_device


def rope_angles(positions, head_dim, base):
    """(n, d) angles m·θ_i, each plane's angle on both of its features (host, float64)."""
    theta = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * theta[None, :]
    return np.concatenate([angles, angles], axis=-1)


def apply_rope(x, cos, sin):
    """x · cos + rotate_half(x) · sin for x (..., n, d) and tables (n, d): one op,
    ``ops.rotary`` (its backward: ``autograd/ops_llama.py``)."""
    return ops.rotary(x, cos, sin)


class RotaryEmbedding:
    """The cos/sin tables of one model's positions; ``__call__(x)`` rotates x (B, H, n, d)."""

    def __init__(self, head_dim, base=10000.0):
        self.head_dim, self.base = head_dim, base
        self.positions = None            # the true positions of this rank's tokens
        self._cache = {}

    def tables(self, n, dtype):
        if self.positions is None:
            positions = np.arange(n)
        elif len(self.positions) != n:
            raise ValueError(f"this rank holds {len(self.positions)} positions of the "
                             f"sequence, got {n} tokens")
        else:
            positions = self.positions
        key = (n, str(dtype), np.asarray(positions).tobytes())
        if key not in self._cache:
            angles = rope_angles(positions, self.head_dim, self.base)
            self._cache = {key: (to_device(np.cos(angles), dtype=dtype),
                                 to_device(np.sin(angles), dtype=dtype))}
        return self._cache[key]

    def __call__(self, x):
        cos, sin = self.tables(x.shape[-2], x.dtype)
        return apply_rope(x, cos, sin)
