"""The attention core's curves for the profile: seconds against b·a·s²·d, measured.

Two curves per kind, because context parallelism does not run the model's attention op:

- ``attention_curve``: the model's own attention core (``nn.attention``), forward and
  backward through autograd, on (b, a, s, d): what one rank computes without cp, and
  Ulysses' whole-sequence attention.
- ``ring_pair_curve``: one chunk pair of ring attention as ``parallel/context/ring.py``
  computes it — ``pair_forward`` and the online-softmax ``merge`` of its (o, L) into the
  running output, then ``pair_backward`` (which rebuilds P = exp(S − L) from the final
  log-sum-exp, as FlashAttention's backward does) and the dQ, dK, dV accumulation —
  for a pair off the diagonal (every score kept) and on it (the causal mask added).  With
  naive attention these are plain array ops where the model's op is a fused softmax that
  keeps P for backward, so a pair costs more than an attention over the same positions
  (1.3–2× on the development machine); ``perf/context.py`` prices the ring's pairs
  with this curve where the profile has it.

Both are medians of a few repetitions (``calibrate_model.median_seconds``).
"""
from __future__ import annotations

from minipar.backend import dtype_of, xp
from minipar.perf.calibrate_model import median_seconds


def attention_curve(kind, shapes, dtype="fp32"):
    """[[b·a·s²·d, forward s, backward s]] of the model's attention core."""
    from minipar.autograd import Tensor
    from minipar.nn.attention import attention_core
    pts = []
    for b, a, s, d in shapes:
        q, k, v = (Tensor(xp.ones((b, a, s, d), dtype=dtype_of(dtype)) * 0.01, requires_grad=True)
                   for _ in range(3))
        fwd = median_seconds(lambda: attention_core(q, k, v, kind))

        def both():
            attention_core(q, k, v, kind).sum().backward()
        pts.append([float(b * a * s * s * d), fwd, max(median_seconds(both, 7) - fwd, 0.5 * fwd)])
    return sorted(pts)


def ring_pair_curve(kind, shapes, dtype="fp32"):
    """[[b·a·s²·d, forward s, backward s, forward s on the diagonal, backward s on the
    diagonal]] of one ring-attention chunk pair of s queries and s keys, merge and
    accumulation included."""
    from minipar.parallel.context.ring import merge, pair_backward, pair_forward
    pts = []
    for b, a, s, d in shapes:
        q, k, v, g = (xp.full((b, a, s, d), 0.01, dtype=dtype_of(dtype)) for _ in range(4))
        row = [float(b * a * s * s * d)]
        for diagonal in (False, True):
            out, lse = xp.zeros_like(q), xp.zeros(q.shape[:3], dtype=q.dtype)
            o, lse_pair = pair_forward(q, k, v, kind, diagonal)
            dq, dk, dv = (xp.zeros_like(q) for _ in range(3))

            def forward():
                merge(out, lse, *pair_forward(q, k, v, kind, diagonal))

            def backward():
                for acc, grad in zip((dq, dk, dv), pair_backward(q, k, v, o, lse_pair, g, kind, diagonal)):
                    acc += grad
            row += [median_seconds(forward), median_seconds(backward)]
        pts.append(row)
    return sorted(pts)
