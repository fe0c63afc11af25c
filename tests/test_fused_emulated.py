"""The fused elementwise CUDA kernels (``fused_elementwise.cu``) on the CPU, against the
NumPy ops in float64.

``fused_cuda.EmulatedKernels`` runs the .cu source itself under the CPU emulator
(``minipar.kernels.emulator``: one fiber per CUDA thread, warp shuffles and
__syncthreads modelled) through ``fused_cuda``'s own launch code, so all but the silicon
is what a GPU run executes.  Checked, on tiny shapes (the emulator is slow):

- LayerNorm, GELU and the attention softmax, forward and backward, and AdamW's update,
  for fp32, fp16 and bf16, against the autograd ops run in float64 on the same (rounded) inputs: fp32 within
  2e-6 of the largest value, fp16 4e-3, bf16 3e-2 (a few roundings of the storage type),
  under AddressSanitizer and UBSan; row lengths that are not a whole number of warps
  (48, 100) or more than a block's threads (300); Nq != Nk for the causal mask;
- no data race under ThreadSanitizer, and the same bits under every schedule;
- the dispatch: with the backend reported as "cupy", the autograd ops run these kernels.
Skipped where the emulator's C++ toolchain (g++ and its sanitizers) is missing.
"""
import numpy as np
import pytest

from minipar.autograd import Tensor, ops
from minipar.kernels import emulator, fused_cuda
from minipar.kernels.fused_cuda import EmulatedKernels
from tests.tolerance import assert_close_normwise

pytestmark = pytest.mark.skipif(emulator.compiler() is None, reason="no C++ compiler")

DTYPES = ["float32", "float16", "bfloat16"]
TOLERANCE = {"float32": 2e-6, "float16": 4e-3, "bfloat16": 3e-2}


def storage(dtype):
    if dtype == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(dtype)


@pytest.fixture(scope="module", autouse=True)
def built_programs():
    """One g++ at a time: the memory build of each storage type, the race build of fp32."""
    for kind in ("f32", "f16", "bf16"):
        emulator.build(fused_cuda.kernel_source(kind), 0, f"fused_{kind}", "memory")
    emulator.build(fused_cuda.kernel_source("f32"), 0, "fused_f32", "race")


def randn(shape, dtype, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(storage(dtype))


def reference(op, inputs, grad):
    """(output, input grads) of the autograd op in float64, from the storage-rounded inputs."""
    tensors = [Tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in inputs]
    out = op(*tensors)
    out.backward(np.asarray(grad, dtype=np.float64))
    return out.data, [t.grad for t in tensors]


def assert_close(got, want, dtype, what):
    got = np.asarray(got, dtype=np.float64)
    assert np.isfinite(got).all(), what
    error = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert error <= TOLERANCE[dtype], (what, error)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,eps", [((2, 3, 48), 1e-5), ((3, 100), 1e-5), ((2, 300), 1e-5),
                                       ((3, 100), 0.5)], ids=str)
def test_layernorm_matches_float64(dtype, shape, eps):
    x, g = randn(shape, dtype, 0, 3.0) + storage(dtype).type(1.5), randn(shape, dtype, 1)
    w, b = randn(shape[-1:], dtype, 2), randn(shape[-1:], dtype, 3)
    kernels = EmulatedKernels()
    y, xhat, inv_sigma = fused_cuda.layernorm_forward(x, w, b, eps, kernels=kernels)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert xhat.dtype == inv_sigma.dtype == np.float32 and inv_sigma.shape == (xhat.shape[0], 1)
    dx, dw, db = fused_cuda.layernorm_backward(g, xhat, inv_sigma, w, kernels=kernels)
    want_y, (want_dx, want_dw, want_db) = reference(lambda *t: ops.layer_norm(*t, eps), (x, w, b), g)
    x64 = np.asarray(x, np.float64).reshape(xhat.shape)
    sigma = np.sqrt(x64.var(axis=-1, keepdims=True) + eps)
    np.testing.assert_allclose(inv_sigma, 1 / sigma, rtol=2e-6)
    np.testing.assert_allclose(xhat, (x64 - x64.mean(axis=-1, keepdims=True)) / sigma, atol=2e-5)
    for got, want, what in [(y, want_y, "y"), (dx, want_dx, "dx"), (dw, want_dw, "dw"), (db, want_db, "db")]:
        assert got.dtype == x.dtype, what
        assert_close(got, want, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_matches_float64(dtype, monkeypatch):
    """1000 values on 2 blocks of 256 threads: the grid-stride loop goes round twice."""
    monkeypatch.setattr(fused_cuda, "STRIDE_MAX_BLOCKS", 2)
    x, g = randn((10, 100), dtype, 4, 3.0), randn((10, 100), dtype, 5)
    kernels = EmulatedKernels()
    y, t = fused_cuda.gelu_forward(x, kernels=kernels)
    dx = fused_cuda.gelu_backward(x, t, g, kernels=kernels)
    want_y, (want_dx,) = reference(ops.gelu, (x,), g)
    x64 = np.asarray(x, np.float64)
    assert_close(t, np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)), dtype, "t")
    for got, want, what in [(y, want_y, "y"), (dx, want_dx, "dx")]:
        assert got.dtype == x.dtype and got.shape == x.shape, what
        assert_close(got, want, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1, "per element"])
def test_adamw_matches_float64(dtype, weight_decay, monkeypatch):
    """Three AdamW steps of the kernel against ``optim.adamw_update``'s array code in
    float64 from the same start, 1000 values on 2 blocks (the loop goes round twice);
    "per element": a flat bucket's decay mask, 0.1 on some values and 0 on the others."""
    from minipar.optim import adamw_update
    monkeypatch.setattr(fused_cuda, "STRIDE_MAX_BLOCKS", 2)
    p, m = randn(1000, dtype, 20), randn(1000, dtype, 21, 0.1)
    v = np.abs(randn(1000, dtype, 22, 0.1))
    if weight_decay == "per element":
        weight_decay = (0.1 * (randn(1000, "float32", 23) > 0)).astype(storage(dtype))
    wd64 = weight_decay if isinstance(weight_decay, float) else np.asarray(weight_decay, np.float64)
    want = [np.asarray(a, np.float64) for a in (p, m, v)]
    kernels = EmulatedKernels()
    for step in (1, 2, 3):
        g = randn(1000, dtype, 30 + step)
        hats = (1 / (1 - 0.9 ** step), 1 / (1 - 0.95 ** step))
        fused_cuda.adamw_update(p, g, m, v, 1e-2, 0.9, 0.95, 1e-8, weight_decay, *hats, kernels=kernels)
        adamw_update(*want[:1], np.asarray(g, np.float64), *want[1:], step, 1e-2, 0.9, 0.95, 1e-8, wd64)
    for got, ref, what in zip((p, m, v), want, "pmv"):
        assert got.dtype == storage(dtype), what
        assert_close(got, ref, dtype, what)
    assert np.abs(np.asarray(p, np.float64) - np.asarray(randn(1000, dtype, 20), np.float64)).max() > 1e-3


SOFTMAX_CASES = [(2, 5, 7), (1, 7, 5), (2, 5, 37), (1, 3, 300)]  # (B·H, Nq, Nk)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SOFTMAX_CASES, ids=str)
def test_attention_softmax_matches_float64(shape, dtype, causal):
    s, g = randn(shape, dtype, 6, 3.0), randn(shape, dtype, 7)
    scale = 0.37
    kernels = EmulatedKernels()
    p = fused_cuda.attention_softmax_forward(s, scale, causal, kernels=kernels)
    ds = fused_cuda.attention_softmax_backward(p, g, scale, kernels=kernels)
    assert p.dtype == ds.dtype == s.dtype and p.shape == ds.shape == s.shape
    with np.errstate(invalid="ignore"):  # the NumPy op's rows that see no key are NaN
        want_p, (want_ds,) = reference(lambda t: ops.attention_softmax(t, scale, causal), (s,), g)
    n_queries, n_keys = shape[1:]
    sees = np.arange(n_queries) + n_keys - n_queries >= 0 if causal else np.ones(n_queries, bool)
    assert not np.asarray(p[:, ~sees], np.float64).any() and not np.asarray(ds[:, ~sees], np.float64).any()
    assert_close(p[:, sees], want_p[:, sees], dtype, "P")
    assert_close(ds[:, sees], want_ds[:, sees], dtype, "dS")
    if causal:
        hidden = np.arange(n_keys)[None, :] > np.arange(n_queries)[:, None] + n_keys - n_queries
        assert not np.asarray(p, np.float64)[:, hidden].any()


def run_all(kernels, dtype="float32"):
    """Every kernel once, on rows longer than a block (two strides per thread, partial warps)."""
    x, w, b = randn((2, 300), dtype, 8), randn(300, dtype, 9), randn(300, dtype, 10)
    y, xhat, inv_sigma = fused_cuda.layernorm_forward(x, w, b, kernels=kernels)
    dx = fused_cuda.layernorm_backward(x, xhat, inv_sigma, w, (True, False, False), kernels=kernels)[0]
    s = randn((1, 2, 270), dtype, 11)
    p = fused_cuda.attention_softmax_forward(s, 0.5, True, kernels=kernels)
    ds = fused_cuda.attention_softmax_backward(p, s, 0.5, kernels=kernels)
    gy, t = fused_cuda.gelu_forward(x, kernels=kernels)
    m, v = randn((2, 300), dtype, 12), np.abs(randn((2, 300), dtype, 13))
    fused_cuda.adamw_update(gy, x, m, v, 1e-2, 0.9, 0.95, 1e-8, 0.1, 10.0, 20.0, kernels=kernels)
    return [y, xhat, inv_sigma, dx, p, ds, t, fused_cuda.gelu_backward(x, t, x, kernels=kernels), gy, m, v]


def test_no_data_race_and_the_same_bits_under_every_schedule():
    """ThreadSanitizer with CUDA's ordering only (a missing __syncthreads between two
    reductions would be reported), and results independent of the order warps run in
    and of what fresh shared memory holds."""
    first = run_all(EmulatedKernels())
    for options in [dict(check="race", schedule="shuffled", seed=1), dict(schedule="greedy"), dict(fill=0x3C)]:
        for a, b in zip(first, run_all(EmulatedKernels(**options))):
            np.testing.assert_array_equal(a, b, err_msg=str(options))


def test_autograd_ops_dispatch_to_the_kernels_on_cupy(monkeypatch):
    """Importing fused_cuda registers it with autograd; with the backend reported as "cupy",
    LayerNorm, Gelu and AttentionSoftmax then launch the six kernels (emulated here, on
    NumPy arrays) and give the array code's results and gradients, and so does AdamW's update.  On NumPy, and for
    float64 or mixed dtypes, the array code runs."""
    from minipar.autograd import ops_math
    assert ops_math._fused["cupy"] is fused_cuda
    x, w, b = randn((2, 5, 48), "float32", 12), randn(48, "float32", 13), randn(48, "float32", 14)

    def model(x, w, b):
        h = ops.gelu(ops.layer_norm(x, w, b))
        return ops.attention_softmax(h @ h.transpose(0, 2, 1), 0.3, True) @ h

    def run():
        tensors = [Tensor(a.copy(), requires_grad=True) for a in (x, w, b)]
        out = model(*tensors)
        out.backward(np.ones(out.shape, np.float32))
        return [out.data] + [t.grad for t in tensors]

    assert ops_math.fused_kernels("gelu", x) is None  # NumPy: too small for its compiled kernels
    want = run()
    launched = []

    class Recording(EmulatedKernels):
        def get(self, name, kind):
            launched.append(name)
            return super().get(name, kind)

    monkeypatch.setattr(ops_math, "backend_name", lambda: "cupy")
    monkeypatch.setattr(fused_cuda, "CupyKernels", Recording)
    assert ops_math.fused_kernels("layernorm", x.astype(np.float64)) is None
    assert ops_math.fused_kernels("layernorm", x, w.astype(np.float16)) is None
    got = run()
    assert sorted(set(launched)) == sorted(["layernorm_forward", "layernorm_backward", "gelu_forward",
                                            "gelu_backward", "softmax_forward", "softmax_backward"])
    for g, w_ in zip(got, want):
        assert_close_normwise(g, w_, 1e-5)
    # the optimizer's update too, from optim.adamw_update
    from minipar.optim import adamw_update
    p, g = randn(300, "float32", 15), randn(300, "float32", 16)
    states = {kind: [p.copy(), np.zeros_like(p), np.zeros_like(p)] for kind in ("kernel", "arrays")}
    adamw_update(states["kernel"][0], g, *states["kernel"][1:], 1, 1e-2, weight_decay=0.1)
    assert launched[-1] == "adamw_update"
    monkeypatch.setattr(ops_math, "backend_name", lambda: "numpy")
    adamw_update(states["arrays"][0], g, *states["arrays"][1:], 1, 1e-2, weight_decay=0.1)
    for a, b in zip(states["kernel"], states["arrays"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("poison", [None, np.inf, -np.inf, np.nan])
def test_unscale_check_unscales_and_flags_non_finite(poison):
    """The loss scaler's pass (``fused_cuda.unscale_check``): g·(1/S) exactly as the array
    code's ``g *= inv`` (one float32 multiply), and a positive flag iff some element is inf
    or NaN — also when it sits in the grid-stride loop's second lap."""
    n = fused_cuda.STRIDE_THREADS * 3 + 5
    g = randn((n,), "float32", 7, scale=1e3)
    if poison is not None:
        g[n - 2] = poison
    want = g.copy()
    want *= 1.0 / 1024.0
    flag = np.zeros(1, np.float32)
    fused_cuda.unscale_check(g, 1.0 / 1024.0, flag, kernels=EmulatedKernels())
    np.testing.assert_array_equal(g, want)
    assert (flag[0] > 0) == (poison is not None)


@pytest.mark.parametrize("poison,blocks", [(None, None), (np.nan, 1)])
def test_unscale_check_norm_over_many_tensors(monkeypatch, poison, blocks):
    """The multi-tensor pass (``fused_cuda.unscale_check_norm``): one launch over gradients
    back to back — an empty one among them — unscales each element as the array code does,
    flags a non-finite one, and sums Σ_t w_t ||g_t||² to fp32 accuracy.  With one block
    every thread walks across all the tensors (the forward-only tensor index)."""
    if blocks is not None:
        monkeypatch.setattr(fused_cuda, "_stride_blocks", lambda n: blocks)
    sizes, weights = [300, 1, 0, 517, 64], np.array([1.0, 0.5, 3.0, 0.25, 2.0], np.float32)
    ends = np.cumsum(sizes).astype(np.int32)
    flat = randn((int(ends[-1]),), "float32", 11, scale=1e3)
    if poison is not None:
        flat[400] = poison
    want = flat.copy()
    want *= 1.0 / 512.0
    pieces = np.split(want.astype(np.float64), ends[:-1])
    want_sq = sum(w * (p ** 2).sum() for w, p in zip(weights.astype(np.float64), pieces))
    flag, squares = np.zeros(1, np.float32), np.zeros(1, np.float32)
    fused_cuda.unscale_check_norm(flat, ends, weights, 1.0 / 512.0, flag, squares,
                                  kernels=EmulatedKernels())
    np.testing.assert_array_equal(flat, want)
    assert (flag[0] > 0) == (poison is not None)
    if poison is None:
        np.testing.assert_allclose(squares[0], want_sq, rtol=1e-5)
    else:
        assert not np.isfinite(squares[0])


def test_unscale_check_norm_leaves_the_values_when_the_scale_is_one():
    """bf16 and fp32 steps have no loss scale: the pass only checks and squares."""
    ends, weights = np.array([5, 9], np.int32), np.ones(2, np.float32)
    flat = randn((9,), "float32", 3)
    before = flat.copy()
    flag, squares = np.zeros(1, np.float32), np.zeros(1, np.float32)
    fused_cuda.unscale_check_norm(flat, ends, weights, 1.0, flag, squares, kernels=EmulatedKernels())
    np.testing.assert_array_equal(flat, before)
    np.testing.assert_allclose(squares[0], (before.astype(np.float64) ** 2).sum(), rtol=1e-6)
    assert flag[0] == 0


def test_unscale_check_norm_has_no_data_race():
    """ThreadSanitizer over three blocks in shuffled order: the block sum's shared memory is
    ordered by its barriers, the flag and the squares are written only by atomics; the
    unscaled values are the same bits, the squares the same to fp32 accuracy (the blocks'
    atomics add in any order)."""
    ends, weights = np.array([200, 200, 650], np.int32), np.array([1.0, 2.0, 0.5], np.float32)
    results = []
    for options in [dict(), dict(check="race", schedule="shuffled", seed=3)]:
        flat = randn((650,), "float32", 5)
        flag, squares = np.zeros(1, np.float32), np.zeros(1, np.float32)
        fused_cuda.unscale_check_norm(flat, ends, weights, 0.25, flag, squares,
                                      kernels=EmulatedKernels(**options))
        results.append((flat, flag[0], squares[0]))
    (a, fa, sa), (b, fb, sb) = results
    np.testing.assert_array_equal(a, b)
    assert fa == fb == 0
    np.testing.assert_allclose(sa, sb, rtol=1e-6)
