"""The numba-compiled fused ops (``kernels/fused_cpu.py``) against the NumPy array ops.

- LayerNorm (eps 1e-5 and 0.5), GELU and the attention softmax (causal with Nq == Nk,
  Nq < Nk and Nq > Nk, and not causal), forward and every gradient, float64 within 1e-12
  and float32 within 2e-6 of the largest value (or of 1), through the autograd ops with the kernels
  on and off;
- AdamW's one-pass update against the array update, and the norm's Σ g² against
  NumPy's float64 sum;
- finite differences of the autograd ops with the kernels forced on (float64);
- the same bits on one thread and on two (rows split over the pool), and for a row
  computed alone or in a block;
- when the kernels run: float32/float64 of at least MIN_ELEMENTS values, not fp16, not
  mixed dtypes, and never with ``MINIPAR_CPU_KERNELS=0``.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

import minipar.nn  # noqa: E402,F401  (registers the kernels)
from minipar.process import threads  # noqa: E402
from minipar.autograd import Tensor, ops, ops_math  # noqa: E402
from minipar.kernels import fused_cpu  # noqa: E402
from tests.gradcheck import check_grad  # noqa: E402
from tests.tolerance import assert_close_normwise  # noqa: E402

TOLERANCE = {"float64": 1e-12, "float32": 2e-6}


@pytest.fixture
def always(monkeypatch):
    """The kernels for every size (the tests' arrays are small)."""
    monkeypatch.setattr(fused_cpu, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(fused_cpu, "_AVAILABLE", True)


def run(fn, arrays, kernels):
    """fn's output and the gradients of all its inputs, with the kernels on or off."""
    ops_math.use_fused_kernels(fused_cpu if kernels else None, backend="numpy")
    try:
        tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
        out = fn(*tensors)
        out.backward(np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype))
        return [out.data] + [t.grad for t in tensors]
    finally:
        ops_math.use_fused_kernels(fused_cpu, backend="numpy")


def randn(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_same(fn, arrays, dtype):
    fused, plain = run(fn, arrays, True), run(fn, arrays, False)
    for i, (a, b) in enumerate(zip(fused, plain)):
        assert a.dtype == b.dtype, i
        # normwise (tests/tolerance.py); floor 1: a gradient that is 0 (d = 1) is 0 up to roundings
        assert_close_normwise(a, b, TOLERANCE[dtype], floor=1.0, err_msg=str(i))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
@pytest.mark.parametrize("d", [1, 7, 64, 100])
def test_layernorm_matches_the_array_op(always, dtype, eps, d):
    arrays = [randn((3, 5, d), dtype, 0) * 3 + 1, randn(d, dtype, 1), randn(d, dtype, 2)]
    assert_same(lambda x, w, b: ops.layer_norm(x, w, b, eps), arrays, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("size", [1, 5, 4099])
def test_gelu_matches_the_array_op(always, dtype, size):
    assert_same(ops.gelu, [randn(size, dtype, 3) * 4], dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("nq,nk,causal", [(9, 9, True), (4, 11, True), (1, 6, True), (7, 7, False), (5, 3, False)])
def test_attention_softmax_matches_the_array_op(always, dtype, nq, nk, causal):
    scores = randn((2, 3, nq, nk), dtype, 4) * 5
    assert_same(lambda s: ops.attention_softmax(s, 0.37, causal), [scores], dtype)


def test_a_query_that_sees_no_key_gets_zeros(always):
    """Nq > Nk with the causal mask: the first Nq - Nk queries see no key.  The kernel
    gives 0 there, as the CUDA and flash kernels do (the array op gives NaN); the rows
    that see keys are the array op's."""
    s = randn((2, 6, 3), "float64", 5)
    p = fused_cpu.attention_softmax_forward(s, 0.5, causal=True)
    assert np.all(p[:, :3] == 0)
    with np.errstate(invalid="ignore"):          # the array op's NaN rows
        run_plain = run(lambda t: ops.attention_softmax(t, 0.5, True), [s], False)[0]
    np.testing.assert_allclose(p[:, 3:], run_plain[:, 3:], rtol=1e-13)


def test_finite_differences_with_the_kernels(always):
    x, w, b = randn((2, 3, 6), "float64", 6), randn(6, "float64", 7), randn(6, "float64", 8)
    check_grad(lambda x, w, b: ops.layer_norm(x, w, b, 0.5), x, w, b)
    check_grad(ops.gelu, randn((4, 5), "float64", 9))
    check_grad(lambda s: ops.attention_softmax(s, 0.7, True), randn((2, 4, 5), "float64", 10))


def test_two_threads_give_the_same_bits(always, monkeypatch):
    """The rows are cut into blocks for the pool; a row's arithmetic is the same.  AdamW
    with a per-element decay: the second block reads its own slice of the mask."""
    from minipar.autograd import rows
    monkeypatch.setattr(fused_cpu, "SPLIT_ELEMENTS", 0)
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 0)            # small arrays split too
    x = randn((64, 48), "float32", 11)
    w, b, s = randn(48, "float32", 12), randn(48, "float32", 13), randn((4, 48, 48), "float32", 14)
    decay = (0.5 * (randn(x.size, "float32", 15) > 0)).astype(np.float32)

    def all_outputs():
        y, xhat, inv = fused_cpu.layernorm_forward(x, w, b)
        dx = fused_cpu.layernorm_backward(x, xhat, inv, w)
        g, t = fused_cpu.gelu_forward(x)
        p = fused_cpu.attention_softmax_forward(s, 0.2)
        state = [x.reshape(-1).copy(), np.zeros(x.size, np.float32), np.zeros(x.size, np.float32)]
        fused_cpu.adamw_update(state[0], x.reshape(-1), *state[1:], 0.1, 0.9, 0.95, 1e-8, decay, 10.0, 20.0)
        return [y, *dx, g, fused_cpu.gelu_backward(x, t, x), p,
                fused_cpu.attention_softmax_backward(p, s, 0.2), *state]

    assert_same_bits_at_1_and_2_threads(all_outputs)


def assert_same_bits_at_1_and_2_threads(all_outputs):
    """``all_outputs()`` (a list of arrays) on one thread and on two: bit for bit."""
    before = threads.current_budget()
    try:
        threads.use_threads(1)
        one = all_outputs()
        threads.use_threads(2)
        two = all_outputs()
    finally:
        threads.use_threads(before.threads)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_rows_bits_do_not_depend_on_its_block(dtype):
    """The row loops do a block's reductions first, then its elementwise pass, and big
    blocks row by row (``cpu_loops.rows_per_pass``): the same row gives the same bits
    in a block of 40 rows (two passes) and alone (a block of one row)."""
    from minipar.kernels.cpu_loops import LOOPS
    rows, d = 40, 33
    x, g = randn((rows, d), dtype, 21), randn((rows, d), dtype, 22)
    w, b = randn(d, dtype, 23), randn(d, dtype, 24)
    p = np.abs(randn((rows, d), dtype, 25))
    k = np.dtype(dtype).type
    calls = {   # name: (arguments, the output arrays it writes)
        "layernorm_forward": lambda o: (x, w, b, k(1 / d), k(1e-5), o[0], o[1], o[2]),
        "layernorm_backward": lambda o: (g, x, p[:, :1], w, k(1 / d), o[0]),
        "softmax_normalise": lambda o: (o[0], k(1e-30)),
        "softmax_backward": lambda o: (p, g, o[0], k(0.3), k(1e-30)),
    }
    for name, args in calls.items():
        outs = {}
        for split in (False, True):
            o = [np.empty_like(x), np.empty_like(x), np.empty((rows, 1), dtype)]
            o[0][...] = p                       # softmax_normalise works in place
            if split:
                for r in range(rows):
                    LOOPS[name](r, r + 1, *args(o))
            else:
                LOOPS[name](0, rows, *args(o))
            outs[split] = o if name == "layernorm_forward" else o[:1]
        for whole, alone in zip(outs[False], outs[True]):
            np.testing.assert_array_equal(whole, alone, err_msg=name)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_attention_softmax_makes_no_subnormal_numbers(dtype):
    """Scores 100 apart in float32 (720 in float64) give probabilities e^-100 ≈ 4e-44:
    subnormal, which would slow every matmul that meets them.  The kernel makes them 0,
    and its dS too; everything else is the array softmax's."""
    from minipar.kernels import fused_cpu
    rng = np.random.default_rng(5)
    gap = 100.0 if dtype == "float32" else 720.0
    s = rng.standard_normal((2, 3, 8, 8)).astype(dtype)
    s[..., ::3] -= gap                                      # every third key far below
    p = fused_cpu.attention_softmax_forward(s, 1.0, causal=False)
    z = np.exp(s.astype(np.float64) - s.max(-1, keepdims=True))
    want = z / z.sum(-1, keepdims=True)
    tiny = np.finfo(dtype).tiny
    assert want[..., ::3].max() < tiny and (want[..., ::3] > 0).all()   # the case is real
    assert (p[..., ::3] == 0).all()
    np.testing.assert_allclose(p, want, rtol=1e-6 if dtype == "float32" else 1e-13,
                               atol=float(fused_cpu.flush_below(dtype)))
    g = rng.standard_normal(s.shape).astype(dtype)
    ds = fused_cpu.attention_softmax_backward(p, g, 0.5)
    a = np.abs(ds)
    assert not ((a > 0) & (a < tiny)).any()
    want_ds = 0.5 * p * (g - (g * p).sum(-1, keepdims=True))
    np.testing.assert_allclose(ds, want_ds, rtol=1e-5 if dtype == "float32" else 1e-12,
                               atol=float(fused_cpu.flush_below(dtype)))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1, "per element"])
def test_adamw_matches_the_array_update(always, dtype, weight_decay):
    """Three steps of optim.adamw_update through the kernel and through the array code,
    to the bit (a flat bucket takes the kernel where a small parameter takes the array
    code, and AdamW amplifies a last-bit difference); "per element": a flat bucket's decay
    mask (0.1 on some values, 0 on the others)."""
    from minipar import optim
    arrays = [randn((33, 7), dtype, i) for i in range(3)]
    if weight_decay == "per element":
        weight_decay = (0.1 * (randn((33, 7), dtype, 9) > 0)).astype(dtype)
        assert ops_math.fused_kernels("adamw", *arrays, weight_decay) is fused_cpu
    results = []
    for kernels in (True, False):
        ops_math.use_fused_kernels(fused_cpu if kernels else None, backend="numpy")
        try:
            p, g, m = (a.copy() for a in arrays)
            v = np.abs(m)
            for step in (1, 2, 3):
                optim.adamw_update(p, g * step, m, v, step, 1e-2, weight_decay=weight_decay)
        finally:
            ops_math.use_fused_kernels(fused_cpu, backend="numpy")
        results.append((p, m, v))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("size", [0, 1, 7, 40001])
def test_sum_of_squares_matches_the_float64_sum(always, dtype, size):
    """The gradient norm's Σ w·g² (``parallel/norm.py``) through the kernel and without it."""
    from minipar.parallel.norm import sum_of_squares
    g = randn((size,), dtype, 31) * 1e3
    expected = 0.25 * float((g.astype(np.float64) ** 2).sum())
    assert sum_of_squares(g, 0.25) == pytest.approx(expected, rel=1e-14, abs=0)
    if size:
        assert fused_cpu.sum_of_squares(g.reshape(1, -1)) == pytest.approx(4 * expected, rel=1e-14)


def test_when_the_kernels_run():
    big, small = np.zeros(fused_cpu.MIN_ELEMENTS, np.float32), np.zeros(8, np.float32)
    for op in ("layernorm", "gelu", "attention_softmax", "adamw"):
        assert ops_math.fused_kernels(op, big) is fused_cpu
        assert ops_math.fused_kernels(op, big.astype(np.float64)) is fused_cpu
        assert ops_math.fused_kernels(op, small) is None                   # the array code is quick
        assert ops_math.fused_kernels(op, big.astype(np.float16)) is None  # no half kernels
        assert ops_math.fused_kernels(op, big, big.astype(np.float64)) is None
    assert ops_math.fused_kernels("softmax", big) is None                  # an op it does not provide


def test_switched_off_by_the_environment():
    code = "import minipar.nn; from minipar.kernels import fused_cpu; print(fused_cpu.available())"
    env = dict(os.environ, MINIPAR_CPU_KERNELS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
