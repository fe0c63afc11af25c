"""Property tests: for random shapes (with broadcasting), axes and dtypes, autograd's
gradients equal finite differences, and the forward equals NumPy's."""
import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import array_shapes, broadcastable_shapes

from minipar.autograd import Tensor, ops
from tests.gradcheck import check_grad
from tests.tolerance import assert_sums_close

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)


@SETTINGS
@given(data=st.data(), op=st.sampled_from(["add", "sub", "mul", "div"]))
def test_broadcasting_binary_ops(data, op):
    shape = data.draw(array_shapes(min_dims=1, max_dims=3, max_side=4))
    other = data.draw(broadcastable_shapes(shape, min_dims=0, max_dims=3, max_side=4))
    rng = np.random.default_rng(len(shape) * 7 + len(other))
    a, b = rng.normal(size=shape), rng.normal(size=other)
    if op == "div":
        b = np.abs(b) + 0.5
    check_grad(getattr(ops, op), a, b)


@SETTINGS
@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=5), data=st.data(),
       keepdims=st.booleans(), reduction=st.sampled_from(["sum", "mean", "max"]))
def test_reductions_over_random_axes(shape, data, keepdims, reduction):
    axis = data.draw(st.none() | st.integers(-len(shape), len(shape) - 1))
    x = np.random.default_rng(sum(shape)).normal(size=shape)
    fn = getattr(ops, reduction)
    np.testing.assert_allclose(fn(Tensor(x), axis, keepdims).numpy(),
                               getattr(np, reduction)(x, axis=axis, keepdims=keepdims))
    check_grad(lambda t: fn(t, axis, keepdims), x)


@SETTINGS
@given(dtype=st.sampled_from([np.float16, np.float32, np.float64]),
       shape=array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=6))
def test_forward_dtypes_follow_numpy(dtype, shape):
    """Each op keeps the input's dtype (half-precision sums come back as float32, the
    mixed-precision rule) and agrees with NumPy computed in float64."""
    x = np.random.default_rng(0).normal(size=shape).astype(dtype)
    t = Tensor(x)
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    ref = x.astype(np.float64)
    for got, want in ((ops.tanh(t), np.tanh(ref)), (ops.exp(t * 0.1), np.exp(ref * 0.1)),
                      (ops.softmax(t), np.exp(ref) / np.exp(ref).sum(-1, keepdims=True))):
        assert got.dtype == dtype
        np.testing.assert_allclose(got.numpy().astype(np.float64), want, rtol=tol, atol=tol)
    total = ops.sum(t)
    assert total.dtype == (np.float32 if dtype == np.float16 else dtype)
    accumulated = np.float32 if dtype == np.float16 else dtype
    assert_sums_close(total.item(), ref.sum(), dtype=accumulated, terms=x.size,
                      abs_sum=np.abs(ref).sum())
