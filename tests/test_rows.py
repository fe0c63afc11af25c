"""Row-blocked fused ops: the same bits on 1 thread or several, and exact gradients.

``autograd/rows.py`` runs LayerNorm, the attention softmax and GELU as row blocks on
the rank's threads.  Each row is computed by the same code whatever the blocking, so
forward and backward must be bit-identical to the one-block (one-thread) call — for
every dtype, odd row counts and block counts that do not divide them.  The finite-
difference checks of these ops live in test_ops_nn / test_autograd; here the threaded
path is checked against finite differences too, so a block boundary bug cannot hide.
"""
import numpy as np
import pytest

from minipar.autograd import Tensor, ops
import minipar.autograd.rows as rows
from tests.tolerance import assert_sums_close


def run_ops(dtype, shape, seed=0):
    """Outputs and input gradients of layer_norm, attention_softmax, gelu."""
    rng = np.random.default_rng(seed)
    b, n, d = shape
    x = Tensor(rng.normal(size=shape).astype(dtype), requires_grad=True)
    w = Tensor(rng.normal(size=(d,)).astype(dtype), requires_grad=True)
    bias = Tensor(rng.normal(size=(d,)).astype(dtype), requires_grad=True)
    s = Tensor(rng.normal(size=(b, 3, n, n)).astype(dtype), requires_grad=True)
    outs = [ops.layer_norm(x, w, bias), ops.attention_softmax(s, 0.37, True), ops.gelu(x)]
    loss = None
    for i, o in enumerate(outs):
        weight = Tensor(rng.normal(size=o.shape).astype(dtype))
        term = ops.sum(o * weight)
        loss = term if loss is None else loss + term
    loss.backward()
    return [o.data for o in outs] + [x.grad, w.grad, bias.grad, s.grad]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_row_blocks_are_bit_identical(monkeypatch, dtype, threads):
    shape = (3, 37, 40)                        # 111 rows: no block count divides it evenly
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(rows, "row_threads", lambda elements: 1)
    one = run_ops(dtype, shape)
    monkeypatch.setattr(rows, "row_threads", lambda elements: threads)
    many = run_ops(dtype, shape)
    for a, b in zip(one, many):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)


def test_threaded_path_matches_finite_differences(monkeypatch):
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(rows, "row_threads", lambda elements: 3)
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=(2, 5, 7))
    w0, b0 = rng.normal(size=7), rng.normal(size=7)
    weight = rng.normal(size=(2, 5, 7))

    def f(x):
        t = Tensor(x, requires_grad=True)
        y = ops.gelu(ops.layer_norm(t, Tensor(w0), Tensor(b0)))
        loss = ops.sum(y * Tensor(weight))
        return loss, t

    loss, t = f(x0)
    loss.backward()
    eps, num = 1e-6, np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        xp_, xm = x0.copy(), x0.copy()
        xp_[i] += eps
        xm[i] -= eps
        num[i] = (f(xp_)[0].data - f(xm)[0].data) / (2 * eps)
    assert np.allclose(t.grad, num, rtol=1e-6, atol=1e-8)


def test_threads_follow_the_budget(monkeypatch):
    from minipar.process import threads
    budget = threads.current_budget()
    monkeypatch.setattr(threads, "_current", budget.__class__(1, 8, 4, "test"))
    assert rows.row_threads(rows.MIN_ELEMENTS) == 4
    assert rows.row_threads(rows.MIN_ELEMENTS - 1) == 1     # small arrays: no hand-off
    monkeypatch.setattr(threads, "_current", budget.__class__(8, 8, 1, "test"))
    assert rows.row_threads(1 << 24) == 1                   # ranks fill the cores


def linear_inputs(dtype):
    rng = np.random.default_rng(3)
    x, w, b = (rng.normal(size=s).astype(dtype) for s in ((3, 70, 24), (24, 40), (40,)))
    return x, w, b, rng.normal(size=(3, 70, 40)).astype(dtype)


def linear_grads(dtype):
    x, w, b, g = (Tensor(a, requires_grad=True) for a in linear_inputs(dtype))
    ops.linear(x, w, b).backward(g.data)
    return [x.grad, w.grad, b.grad]


def linear_grad_sums(dtype):
    """(terms, Σ|t|) of each gradient's sums: dX = g·Wᵀ over the 40 outputs, dW = Xᵀ·g and
    db = Σ g over the 210 rows."""
    x, w, _, g = (np.abs(a.astype(np.float64)) for a in linear_inputs(dtype))
    rows_x, rows_g = x.reshape(-1, 24), g.reshape(-1, 40)
    return [(40, g @ w.T), (210, rows_x.T @ rows_g), (210, rows_g.sum(0))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_linear_backward_side_by_side_on_two_threads(monkeypatch, dtype):
    """On exactly two threads Linear's dX and dW run whole, one on each thread: the same
    bits as one thread; on three each is split as before, to the rounding of sums in
    another order (tests/tolerance.py: relative to the terms, not to each result)."""
    from minipar.process import threads
    from minipar.autograd import ops_reduce
    used = []
    real = ops_reduce.side_by_side
    monkeypatch.setattr(ops_reduce, "side_by_side", lambda *f: used.append(1) or real(*f))
    monkeypatch.setattr(rows, "MIN_MATMUL_FLOPS", 0)
    previous = threads.current_budget().threads
    try:
        threads.use_threads(1)
        want = linear_grads(dtype)
        threads.use_threads(2)
        got = linear_grads(dtype)
        assert used, "two threads should take the side-by-side path"
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        used.clear()
        threads.use_threads(3)
        for g, w, (terms, abs_sum) in zip(linear_grads(dtype), want, linear_grad_sums(dtype)):
            assert_sums_close(g, w, dtype=dtype, terms=terms, abs_sum=abs_sum)
        assert not used
    finally:
        threads.use_threads(previous)
