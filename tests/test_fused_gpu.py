"""The fused elementwise CUDA kernels on a GPU (skipped without CuPy + a GPU).

On the CuPy backend LayerNorm, Gelu, AttentionSoftmax and AdamW run ``fused_cuda``'s kernels for
fp32, fp16 and bf16 (where CuPy has it).  Checked through the autograd ops, as a model
calls them:

- against the same ops' array code in float64 on the same (rounded) inputs — on the GPU
  through ``xp`` (float64 has no kernel) and, once, on the NumPy backend: fp32 within
  2e-5 of the largest value, fp16 4e-3, bf16 3e-2;
- their gradients against central finite differences of the fused forward itself (fp32,
  a few random directions: (f(x + hv) - f(x - hv)) / 2h = <∇f, v> within 1e-2 relative);
- shapes a GPU run meets: GPT-sized rows (768, 3072), more rows than grid.y would allow,
  a GELU longer than the grid (the grid-stride loop), causal Nq != Nk, rows longer than
  a block's threads.
"""
import contextlib

import numpy as np
import pytest

from minipar import backend
from minipar.autograd import Tensor, ops
from tests.tolerance import assert_close_normwise

pytestmark = pytest.mark.skipif(not backend.cupy_available(), reason="needs CuPy and a CUDA GPU")
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


@contextlib.contextmanager
def on_backend(name):
    previous = backend.backend_name()
    backend.set_backend(name)
    try:
        yield
    finally:
        backend.set_backend(previous)


@pytest.fixture(autouse=True)
def cupy_backend():
    from minipar.kernels import fused_cuda  # noqa: F401  (importing it registers the kernels)
    with on_backend("cupy"):
        yield


def device_dtype(name):
    import cupy
    if name == "bfloat16":
        if not hasattr(cupy, "bfloat16"):
            pytest.skip("this CuPy has no bfloat16")
        return cupy.bfloat16
    return np.dtype(name)


def randn(shape, seed, scale=1.0, shift=0.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale + shift


def run(op, arrays, grad):
    """(output, input grads) of ``op`` on Tensors of ``arrays`` (device arrays of the backend)."""
    tensors = [Tensor(a, requires_grad=True) for a in arrays]
    out = op(*tensors)
    out.backward(grad)
    return out.data, [t.grad for t in tensors]


def check(name, op, host_arrays, host_grad, dtype, rows=None):
    """The op in ``dtype`` (fused) against the op in float64 (array code) on the rounded inputs."""
    import cupy
    arrays = [cupy.asarray(a).astype(device_dtype(dtype)) for a in host_arrays]
    grad = cupy.asarray(host_grad).astype(arrays[0].dtype)
    from minipar.autograd.ops_math import fused_kernels
    assert fused_kernels(name, *arrays) is not None, "the fused kernels should take these arrays"
    got = run(op, arrays, grad)
    want = run(op, [a.astype(cupy.float64) for a in arrays], grad.astype(cupy.float64))
    for what, g, w in [("out", got[0], want[0])] + [(f"grad {i}", *p) for i, p in enumerate(zip(got[1], want[1]))]:
        assert g.dtype == arrays[0].dtype, what
        g, w = (backend.to_host(a.astype(cupy.float64)) for a in (g, w))
        if rows is not None:
            g, w = g[..., rows, :], w[..., rows, :]
        assert np.isfinite(g).all(), what
        assert_close_normwise(g, w, TOLERANCE[dtype], floor=1.0, err_msg=what)


DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 77, 768), (3, 100), (2, 5000), (70000, 64)], ids=str)
def test_layernorm(shape, dtype):
    check("layernorm", lambda x, w, b: ops.layer_norm(x, w, b, 1e-5),
          [randn(shape, 0, 3.0, 1.5), randn(shape[-1:], 1), randn(shape[-1:], 2)], randn(shape, 3), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 77, 3072), (1000, 2100)], ids=str)  # 2.1M values: 8192 blocks, strided
def test_gelu(shape, dtype):
    check("gelu", ops.gelu, [randn(shape, 4, 3.0)], randn(shape, 5), dtype)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 4, 100, 100), (1, 2, 37, 150), (1, 2, 150, 37), (1, 1, 4, 3000)], ids=str)
def test_attention_softmax(shape, dtype, causal):
    n_queries, n_keys = shape[-2:]
    sees = np.arange(n_queries) + n_keys - n_queries >= 0 if causal else np.ones(n_queries, bool)
    with np.errstate(invalid="ignore"):
        check("attention_softmax", lambda s: ops.attention_softmax(s, 0.125, causal),
              [randn(shape, 6, 8.0)], randn(shape, 7), dtype, rows=np.flatnonzero(sees))


def test_fused_ops_match_the_numpy_backend():
    """fp32 on the GPU (kernels) against the same ops on the NumPy backend (array code)."""
    import cupy
    x, w, b = randn((64, 96), 8).astype(np.float32), randn(96, 9).astype(np.float32), randn(96, 10).astype(np.float32)

    def model(x, w, b):
        h = ops.gelu(ops.layer_norm(x, w, b)).reshape(8, 8, 96)
        return ops.attention_softmax(h @ h.transpose(0, 2, 1), 0.1, True) @ h

    grad = randn((8, 8, 96), 11).astype(np.float32)
    got = run(model, [cupy.asarray(a) for a in (x, w, b)], cupy.asarray(grad))
    with on_backend("numpy"):
        want = run(model, [x, w, b], grad)
    for g, w_ in zip([got[0], *got[1]], [want[0], *want[1]]):
        g = backend.to_host(g)
        assert_close_normwise(g, w_, 1e-4)


def directional_check(op, arrays, directions=3, h=1e-2):
    """<∇ sum(op(x)·R), v> by autograd vs the central difference along v, fp32 on the GPU."""
    import cupy
    rng = np.random.default_rng(12)
    arrays = [cupy.asarray(a, dtype=cupy.float32) for a in arrays]
    weights = cupy.asarray(rng.standard_normal(op(*[Tensor(a) for a in arrays]).shape), dtype=cupy.float32)
    _, grads = run(op, arrays, weights)

    def loss(xs):
        return float((op(*[Tensor(x) for x in xs]).data.astype(cupy.float64) * weights).sum())

    for _ in range(directions):
        v = [cupy.asarray(rng.standard_normal(a.shape), dtype=cupy.float32) for a in arrays]
        plus = loss([a + h * d for a, d in zip(arrays, v)])
        minus = loss([a - h * d for a, d in zip(arrays, v)])
        numeric = (plus - minus) / (2 * h)
        analytic = sum(float((g.astype(cupy.float64) * d).sum()) for g, d in zip(grads, v))
        assert abs(analytic - numeric) <= 1e-2 * max(1.0, abs(numeric)), (analytic, numeric)


def test_layernorm_gradient_matches_finite_differences():
    directional_check(lambda x, w, b: ops.layer_norm(x, w, b), [randn((6, 100), 13, 2.0, 1.0),
                                                                randn(100, 14), randn(100, 15)])


def test_gelu_gradient_matches_finite_differences():
    directional_check(ops.gelu, [randn((7, 300), 16, 2.0)])


@pytest.mark.parametrize("causal", [True, False])
def test_attention_softmax_gradient_matches_finite_differences(causal):
    directional_check(lambda s: ops.attention_softmax(s, 0.5, causal), [randn((2, 30, 50), 17, 2.0)])


@pytest.mark.parametrize("per_element", [False, True])
def test_adamw_update_matches_the_array_code(per_element):
    """``optim.adamw_update`` through the kernel against its array code in float64, three
    steps of a GPT-2-sized matrix (2.4 M values: the grid-stride loop goes round), with a
    scalar weight decay or a per-element one (a flat bucket's mask).  fp32 only: AdamW
    runs on the fp32 master weights (in fp16 state, v underflows to 0 where the float64
    reference does not, and the update explodes in both the kernel and the array code)."""
    import cupy
    from minipar.autograd.ops_math import fused_kernels
    from minipar.optim import adamw_update
    shape = (768, 3072)
    p, m = (cupy.asarray(randn(shape, s, 0.1)).astype(cupy.float32) for s in (40, 41))
    v = cupy.abs(cupy.asarray(randn(shape, 42, 0.1))).astype(p.dtype)
    decay = 0.1 * (cupy.asarray(randn(shape, 43)) > 0).astype(p.dtype) if per_element else 0.1
    assert fused_kernels("adamw", p, p, m, v, *([decay] if per_element else [])) is not None
    want = [a.astype(cupy.float64) for a in (p, m, v)]
    decay64 = decay.astype(cupy.float64) if per_element else decay
    for step in (1, 2, 3):
        g = cupy.asarray(randn(shape, 50 + step)).astype(p.dtype)
        adamw_update(p, g, m, v, step, 1e-3, weight_decay=decay)
        adamw_update(want[0], g.astype(cupy.float64), *want[1:], step, 1e-3, weight_decay=decay64)
    for got, ref, what in zip((p, m, v), want, "pmv"):
        got, ref = (backend.to_host(a.astype(cupy.float64)) for a in (got, ref))
        assert_close_normwise(got, ref, TOLERANCE["float32"], floor=1.0, err_msg=what)
