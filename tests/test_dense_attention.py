"""The oracle itself: ``minipar.kernels.dense`` and the one causal mask, checked without it.

Every flash test compares against dense attention, so dense attention is checked here
against code that shares nothing with it: the mask from its rule written as a loop, the
softmax one row at a time with ``math.exp``, the gradients by finite differences.
"""
import math

import numpy as np
import pytest

from minipar.autograd.ops_attention import causal_bias
from minipar.kernels.dense import causal_mask, dense_attention_backward, dense_attention_forward

SIZES = [(1, 1), (5, 5), (4, 9), (9, 4), (7, 1)]  # square, fewer queries (decode), more queries


def loop_mask(nq, nk):
    """Query i sees key j iff j <= i + nk - nq, one entry at a time."""
    return np.array([[j <= i + nk - nq for j in range(nk)] for i in range(nq)], dtype=bool)


def loop_attention(q, k, v, causal):
    """O[b, h, i] = Σ_j p_j v_j with p the softmax of row i's visible scores, by hand."""
    out = np.zeros(q.shape)
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    for b, h in np.ndindex(q.shape[:2]):
        for i in range(nq):
            seen = [j for j in range(nk) if not causal or j <= i + nk - nq]
            if not seen:
                continue  # a row that sees no key: output 0
            scores = [sum(q[b, h, i, c] * k[b, h, j, c] for c in range(d)) / math.sqrt(d) for j in seen]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            for j, w in zip(seen, weights):
                out[b, h, i] += w / sum(weights) * v[b, h, j]
    return out


def random_qkv(nq, nk, d, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, 2, nq, d)), rng.standard_normal((2, 2, nk, d)), rng.standard_normal((2, 2, nk, d))


@pytest.mark.parametrize("nq,nk", SIZES)
def test_causal_mask_is_the_bottom_right_rule(nq, nk):
    mask = causal_mask(nq, nk)
    np.testing.assert_array_equal(mask, loop_mask(nq, nk))
    assert mask[-1].all()  # the last query sees every key
    bias = causal_bias(nq, nk, np.float64)
    np.testing.assert_array_equal(bias, np.where(loop_mask(nq, nk), 0.0, -np.inf))


def test_a_tile_of_the_mask_is_the_slice_of_the_whole_mask():
    whole = loop_mask(40, 23)
    for q0, k0, rows, cols in [(0, 0, 16, 8), (16, 8, 16, 8), (32, 16, 8, 7), (5, 3, 1, 1)]:
        np.testing.assert_array_equal(causal_mask(40, 23, q0, k0, rows, cols),
                                      whole[q0:q0 + rows, k0:k0 + cols])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", SIZES)
def test_forward_is_a_row_by_row_softmax(nq, nk, causal):
    q, k, v = random_qkv(nq, nk, 3, seed=nq * 10 + nk)
    out, probs = dense_attention_forward(q, k, v, causal)
    want = loop_attention(q, k, v, causal)
    assert np.abs(out - want).max() <= 1e-12 * max(np.abs(want).max(), 1.0)
    assert probs.shape == (2, 2, nq, nk) and np.isfinite(probs).all()
    sees = loop_mask(nq, nk).any(-1) if causal else np.ones(nq, bool)
    np.testing.assert_allclose(probs.sum(-1), np.broadcast_to(sees * 1.0, probs.shape[:-1]), atol=1e-12)


@pytest.mark.parametrize("nq,nk", [(4, 5), (5, 3)])
def test_backward_matches_finite_differences(nq, nk):
    q, k, v = random_qkv(nq, nk, 3)
    q, k, v = q[:1, :1], k[:1, :1], v[:1, :1]
    weights = np.random.default_rng(3).standard_normal(q.shape)
    loss = lambda q, k, v: (dense_attention_forward(q, k, v, True)[0] * weights).sum()  # noqa: E731
    analytic = dense_attention_backward(q, k, v, dense_attention_forward(q, k, v, True)[1], weights)
    eps = 1e-6
    for which, grad in enumerate(analytic):
        arrays = [q, k, v]
        numeric = np.zeros_like(arrays[which])
        for idx in np.ndindex(numeric.shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            numeric[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        assert np.isfinite(grad).all()
        np.testing.assert_allclose(grad, numeric, atol=1e-8)


def test_half_inputs_take_their_softmax_in_float32():
    q, k, v = (a.astype(np.float16) for a in random_qkv(33, 33, 16))
    out, probs = dense_attention_forward(q, k, v, True)
    assert out.dtype == probs.dtype == np.float16
    want = loop_attention(*(a.astype(np.float64) for a in (q, k, v)), True)
    assert np.abs(out - want).max() < 5e-3
