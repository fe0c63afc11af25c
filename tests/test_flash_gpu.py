"""The CUDA kernels against the float64 reference, on a GPU (skipped without CuPy + a GPU).

Normwise (tests/tolerance.py: max error relative to the largest value, at least 1):
fp32 kernels ~1e-5; fp16 tensor-core kernels on unit-scale inputs: forward 2e-3,
gradients (which pass P and dS through fp16) 4e-3; bf16 8x looser.  The reference runs on the
same (fp16-rounded) inputs, in float64, on the GPU through ``xp``.
"""
import ml_dtypes  # noqa: F401  (numpy's name "bfloat16")
import numpy as np
import pytest

from minipar import backend
from tests.tolerance import assert_close_normwise

# forward, gradients (bf16 keeps 8 significant bits to fp16's 11: 8x looser)
TOLERANCES = {"float32": (1e-5, 1e-5), "float16": (2e-3, 4e-3), "bfloat16": (2.0 ** -7, 2.0 ** -6)}

pytestmark = pytest.mark.skipif(not backend.cupy_available(), reason="needs CuPy and a CUDA GPU")


@pytest.fixture(autouse=True)
def cupy_backend():
    previous = backend.backend_name()
    backend.set_backend("cupy")
    yield
    backend.set_backend(previous)


def inputs(batch, heads, n_queries, n_keys, head_dim, dtype, seed=0):
    import cupy
    rng = np.random.default_rng(seed)
    shapes = [(batch, heads, n_queries, head_dim), (batch, heads, n_keys, head_dim),
              (batch, heads, n_keys, head_dim), (batch, heads, n_queries, head_dim)]
    return [cupy.asarray(rng.standard_normal(s).astype(dtype)) for s in shapes]


def reference(q, k, v, grad_out, causal):
    from minipar.kernels.flash_reference import flash_backward_reference, flash_forward_reference
    q, k, v, grad_out = (a.astype("float64") for a in (q, k, v, grad_out))
    out, lse = flash_forward_reference(q, k, v, causal)
    return (out, lse) + flash_backward_reference(q, k, v, out, lse, grad_out, causal)


def assert_close(got, want, rtol):
    """Normwise against the reference; floor 1: an all-zero gradient is zero up to rounding."""
    assert_close_normwise(backend.to_host(got), backend.to_host(want), rtol, floor=1.0)


CASES = [  # (B, H, Nq, Nk, d)
    (2, 3, 77, 77, 64),       # odd N, one partial tile
    (1, 2, 256, 256, 128),    # exact tiles
    (2, 2, 200, 200, 32),
    (1, 1, 1, 1, 64),
    (1, 2, 100, 37, 64),      # causal rows 0..62 see nothing
    (1, 2, 37, 150, 128),     # fewer queries than keys
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_kernels_match_reference(dtype, shape, causal):
    from minipar.kernels import flash_cuda
    batch, heads, n_queries, n_keys, head_dim = shape
    q, k, v, grad_out = inputs(batch, heads, n_queries, n_keys, head_dim, dtype)
    want_out, want_lse, *want_grads = reference(q, k, v, grad_out, causal)
    out, lse = flash_cuda.forward(q, k, v, causal)
    assert out.dtype == q.dtype and lse.dtype == np.float32
    grads = flash_cuda.backward(q, k, v, out, lse, grad_out, causal)

    assert_close(out, want_out, TOLERANCES[dtype][0])
    lse_host, want_lse_host = backend.to_host(lse), backend.to_host(want_lse)
    assert np.array_equal(np.isneginf(lse_host), np.isneginf(want_lse_host))
    seen = np.isfinite(want_lse_host)
    np.testing.assert_allclose(lse_host[seen], want_lse_host[seen], atol=1e-4)
    for got, want in zip(grads, want_grads):
        assert got.dtype == q.dtype
        assert_close(got, want, TOLERANCES[dtype][1])


def test_long_sequence_fp16_causal():
    from minipar.kernels import flash_cuda
    q, k, v, grad_out = inputs(1, 2, 2048, 2048, 128, "float16", seed=1)
    want_out, _, *want_grads = reference(q, k, v, grad_out, True)
    out, lse = flash_cuda.forward(q, k, v, True)
    assert_close(out, want_out, 2e-3)
    for got, want in zip(flash_cuda.backward(q, k, v, out, lse, grad_out, True), want_grads):
        assert_close(got, want, 4e-3)


def test_autograd_function_uses_the_kernels(monkeypatch):
    from minipar.autograd import Tensor
    from minipar.kernels import flash_attention as module
    from minipar.kernels import flash_cuda
    calls = []
    real_forward = flash_cuda.forward
    monkeypatch.setattr(flash_cuda, "forward", lambda *a, **kw: calls.append(a) or real_forward(*a, **kw))
    q, k, v, grad_out = inputs(2, 2, 130, 130, 64, "float16")
    tensors = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = module.flash_attention(*tensors, causal=True)
    out.backward(grad_out)
    assert len(calls) == 1
    want_out, _, *want_grads = reference(q, k, v, grad_out, True)
    assert_close(out.data, want_out, 2e-3)
    for tensor, want in zip(tensors, want_grads):
        assert_close(tensor.grad, want, 4e-3)


def test_array_reference_runs_on_the_gpu_too(monkeypatch):
    from minipar.kernels import flash_attention as module
    q, k, v, _ = inputs(1, 2, 70, 70, 48, "float32")  # d = 48 has no tensor-core kernel anyway
    out, _ = module.flash_forward(q, k, v, True, implementation="reference")
    assert_close(out, module.dense_attention(q.astype("float64"), k.astype("float64"),
                                             v.astype("float64"), True), 1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_grouped_kv_heads_match_a_reference_that_repeats_them(dtype):
    """4 query heads on 2 KV heads, read in place by the kernels; the reference repeats K/V
    to 4 heads and sums the repeated heads' dK, dV over each group."""
    import cupy
    from minipar.kernels import flash_cuda
    q, grad_out = inputs(1, 4, 70, 70, 64, dtype)[::3]
    k, v = inputs(1, 2, 70, 70, 64, dtype, seed=1)[1:3]
    want_out, _, want_dq, dk_rep, dv_rep = reference(q, cupy.repeat(k, 2, axis=1), cupy.repeat(v, 2, axis=1),
                                                     grad_out, True)
    out, lse = flash_cuda.forward(q, k, v, True)
    dq, dk, dv = flash_cuda.backward(q, k, v, out, lse, grad_out, True)
    assert dk.shape == dv.shape == k.shape
    tol = 1e-5 if dtype == "float32" else 2e-3
    assert_close(out, want_out, tol)
    for got, want in ((dq, want_dq), (dk, dk_rep.reshape(1, 2, 2, 70, 64).sum(axis=2)),
                      (dv, dv_rep.reshape(1, 2, 2, 70, 64).sum(axis=2))):
        assert_close(got, want, 2 * tol)
