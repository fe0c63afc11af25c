"""Central finite differences: the oracle every backward is checked against."""
import numpy as np

from minipar.autograd import Tensor


def numeric_grad(f, arrays, eps=1e-6):
    """d f(arrays) / d arrays[i] by (f(x+eps) - f(x-eps)) / 2eps, element by element."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        it = np.nditer(a, flags=["multi_index"])
        for _ in it:
            i = it.multi_index
            old = a[i]
            a[i] = old + eps
            plus = f(*arrays)
            a[i] = old - eps
            minus = f(*arrays)
            a[i] = old
            g[i] = (plus - minus) / (2 * eps)
        grads.append(g)
    return grads


def check_grad(fn, *arrays, atol=1e-7, rtol=1e-6, seed=0):
    """Compare autograd's gradient of sum(fn(...) * R) (R random) with finite differences."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    out_shape = fn(*[Tensor(a) for a in arrays]).shape
    weights = np.random.default_rng(seed).normal(size=out_shape)

    def scalar(*xs):
        return float((fn(*[Tensor(x) for x in xs]).numpy() * weights).sum())

    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    out.backward(weights)
    expected = numeric_grad(scalar, arrays)
    for i, (t, e) in enumerate(zip(tensors, expected)):
        assert t.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(t.grad, e, atol=atol, rtol=rtol, err_msg=f"input {i}")
