"""The tiled FlashAttention reference against dense attention, on the NumPy backend.

The oracle is ``minipar.kernels.dense`` in float64: its backward goes through the
softmax Jacobian (dS = P∘(dP - rowsum(P∘dP))), a different route from the kernel's
D = rowsum(dO∘O).  Dense attention itself is checked independently (an explicit
per-row softmax, finite differences) in tests/test_dense_attention.py.
"""
import math
import tracemalloc

import numpy as np
import pytest

from minipar.autograd import Tensor
from minipar.kernels import flash_reference
from minipar.kernels.dense import causal_mask, dense_attention_backward, dense_attention_forward
from minipar.kernels.flash_attention import flash_attention
from minipar.kernels.flash_reference import (dense_attention, flash_backward_reference,
                                             flash_forward_reference)
from tests.tolerance import assert_close_normwise

RTOL = 1e-12


def random_qkv(n_queries, n_keys, head_dim, batch=2, heads=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, heads, n_queries, head_dim)).astype(dtype)
    k = rng.standard_normal((batch, heads, n_keys, head_dim)).astype(dtype)
    v = rng.standard_normal((batch, heads, n_keys, head_dim)).astype(dtype)
    return q, k, v


def dense_probs(q, k, causal):
    return dense_attention_forward(q, k, k, causal)[1]


def dense_backward(q, k, v, grad_out, causal):
    """dq, dk, dv of softmax(QKᵀ/√d)V through the full Jacobian (the shared dense attention)."""
    return dense_attention_backward(q, k, v, dense_probs(q, k, causal), grad_out)


def assert_close(actual, expected, rtol=RTOL):
    # normwise; floor 1: an all-zero gradient (N = 1) is zero up to roundings
    assert_close_normwise(actual, expected, rtol, floor=1.0)


SHAPES = [  # (Nq, Nk, d, block_q, block_k)
    (37, 37, 16, 16, 8),     # N not a multiple of either tile
    (5, 5, 8, 16, 16),       # N smaller than one tile
    (64, 64, 32, 16, 16),    # exact multiple
    (50, 50, 64, 64, 64),    # default tiles, one partial tile
    (23, 40, 16, 8, 16),     # fewer queries than keys (decode-like)
    (40, 23, 16, 16, 8),     # more queries than keys: causal rows that see nothing
    (1, 1, 4, 64, 64),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_queries,n_keys,head_dim,block_q,block_k", SHAPES)
def test_forward_and_backward_match_dense(n_queries, n_keys, head_dim, block_q, block_k, causal):
    q, k, v = random_qkv(n_queries, n_keys, head_dim, seed=n_queries + head_dim)
    grad_out = np.random.default_rng(1).standard_normal(q.shape)
    out, lse = flash_forward_reference(q, k, v, causal, block_q, block_k)
    assert_close(out, dense_attention(q, k, v, causal))
    assert_close(out, dense_probs(q, k, causal) @ v)
    grads = flash_backward_reference(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    for got, want in zip(grads, dense_backward(q, k, v, grad_out, causal)):
        assert not np.isnan(got).any()
        assert_close(got, want)


def test_log_sum_exp_is_saved():
    q, k, v = random_qkv(29, 29, 8)
    _, lse = flash_forward_reference(q, k, v, causal=True, block_q=8, block_k=8)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(8)
    scores = np.where(causal_mask(29, 29), scores, -np.inf)
    want = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
    assert_close(lse, want)


@pytest.mark.parametrize("causal", [False, True])
def test_autograd_function_matches_dense_backward(causal):
    q, k, v = random_qkv(45, 45, 16)
    grad_out = np.random.default_rng(2).standard_normal(q.shape)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = flash_attention(tq, tk, tv, causal=causal)
    assert out.shape == q.shape and out.requires_grad
    out.backward(grad_out)
    for tensor, want in zip((tq, tk, tv), dense_backward(q, k, v, grad_out, causal)):
        assert_close(tensor.grad, want)


def test_rows_that_see_nothing_give_zero_not_nan():
    # Causal, 12 queries, 5 keys: query i sees keys j <= i - 7, so rows 0..6 see nothing.
    q, k, v = random_qkv(12, 5, 8)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = flash_attention(tq, tk, tv, causal=True)
    out.backward(np.ones(q.shape))
    _, lse = flash_forward_reference(q, k, v, causal=True, block_q=4, block_k=4)
    for array in (out.data, tq.grad, tk.grad, tv.grad):
        assert np.isfinite(array).all()
    assert (out.data[:, :, :7] == 0).all() and (tq.grad[:, :, :7] == 0).all()
    assert np.isneginf(lse[:, :, :7]).all() and np.isfinite(lse[:, :, 7:]).all()
    assert_close(out.data[:, :, 7:], dense_probs(q, k, True)[:, :, 7:] @ v)


def test_causal_tiles_above_the_diagonal_are_skipped(monkeypatch):
    visited = []
    real = flash_reference._masked_scores

    def counting(q_tile, k_tile, q0, k0, *args):
        visited.append((q0, k0))
        return real(q_tile, k_tile, q0, k0, *args)

    monkeypatch.setattr(flash_reference, "_masked_scores", counting)
    q, k, v = random_qkv(128, 128, 8, batch=1, heads=1)
    out, lse = flash_forward_reference(q, k, v, causal=True, block_q=32, block_k=32)
    assert sorted(visited) == [(qi, ki) for qi in range(0, 128, 32) for ki in range(0, qi + 1, 32)]
    visited.clear()
    flash_backward_reference(q, k, v, out, lse, np.ones(q.shape), True, 32, 32)
    assert len(visited) == 10  # 4 + 3 + 2 + 1 tiles on and below the diagonal, not 16


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_low_precision_inputs_accumulate_in_fp32(dtype, tol):
    q, k, v = random_qkv(70, 70, 32, dtype=dtype)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = flash_attention(tq, tk, tv, causal=True)
    out.backward(np.ones(q.shape, dtype))
    assert out.dtype == dtype and tq.grad.dtype == dtype
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    assert_close_normwise(out.data, dense_attention(q64, k64, v64, True), tol, floor=1.0)
    dq = dense_backward(q64, k64, v64, np.ones(q.shape), True)[0]
    assert_close_normwise(tq.grad, dq, 10 * tol, floor=1.0)


def test_never_allocates_an_n_by_n_array():
    n, head_dim = 1024, 16
    q, k, v = random_qkv(n, n, head_dim, batch=1, heads=1)
    n_by_n = n * n * 8

    def peak(fn):
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    dense_peak = peak(lambda: dense_attention(q, k, v, causal=True))
    tiled_peak = peak(lambda: flash_forward_reference(q, k, v, causal=True))
    assert dense_peak >= n_by_n
    assert tiled_peak < n_by_n / 8, (tiled_peak, n_by_n)
    out, lse = flash_forward_reference(q, k, v, causal=True)
    backward_peak = peak(lambda: flash_backward_reference(q, k, v, out, lse, out, True))
    assert backward_peak < n_by_n / 4, (backward_peak, n_by_n)


def test_shape_errors_are_loud():
    q, k, v = random_qkv(8, 8, 4)
    with pytest.raises(ValueError, match="head dim"):
        flash_attention(Tensor(q), Tensor(k[..., :2]), Tensor(v[..., :2]))


def test_attention_implementation_is_checked(monkeypatch):
    from minipar.kernels import flash_attention as module
    q, k, v = random_qkv(8, 8, 16)
    with pytest.raises(ValueError, match="must be None, 'reference' or 'emulated'"):
        module.flash_forward(q, k, v, implementation="fast")
    with pytest.raises(ValueError, match="float32, float16 or bfloat16.*got numpy float64"):   # no kernel
        module.flash_forward(q, k, v, implementation="emulated")
