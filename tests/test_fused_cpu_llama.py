"""The llama block's numba-compiled ops (``kernels/fused_cpu_llama.py``) against their
array code in ``autograd/ops_llama.py``:

- RMSNorm (d = 1, 7, 64; eps 1e-5 and 0.5), SwiGLU's product and the rotary embedding
  (heads outer, and ``heads()``' transposed (B, N, H, d) memory), forward and every
  gradient, float64 within 1e-12 and float32 within 2e-6 normwise, kernels on and off;
  the rotation to the bit (it is the array code's arithmetic, operation for operation);
- finite differences of the three ops with the kernels forced on (float64);
- the same bits on one thread and on two (rows split over the pool), and for an RMSNorm
  row computed alone or in a block;
- half precision and odd head widths take the array code, which still gives SwiGLU's
  float32 value rounded once.
"""
import numpy as np
import pytest

pytest.importorskip("numba")

import minipar.nn  # noqa: E402,F401  (registers the kernels)
from minipar.autograd import Tensor, ops, ops_math  # noqa: E402
from minipar.kernels import fused_cpu  # noqa: E402
from tests.gradcheck import check_grad  # noqa: E402
from tests.test_fused_cpu import (TOLERANCE, always, assert_same_bits_at_1_and_2_threads,  # noqa: E402,F401
                                  randn, run)


def assert_same(fn, arrays, dtype, exact=False):
    fused, plain = run(fn, arrays, True), run(fn, arrays, False)
    for i, (a, b) in enumerate(zip(fused, plain)):
        assert a.dtype == b.dtype, i
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=str(i))
        else:
            scale = max(1.0, float(np.abs(b).max()))
            assert np.abs(a - b).max() <= TOLERANCE[dtype] * scale, i


def tables(n, d, dtype):
    angles = np.arange(n)[:, None] * 10.0 ** (-np.arange(d) / d)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("eps", [1e-5, 0.5])
@pytest.mark.parametrize("d", [1, 7, 64])
def test_rmsnorm_matches_the_array_op(always, dtype, eps, d):
    arrays = [randn((3, 5, d), dtype, 0) * 3 + 1, randn(d, dtype, 1)]
    assert_same(lambda x, w: ops.rms_norm(x, w, eps), arrays, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_swiglu_matches_the_array_op(always, dtype):
    assert_same(ops.swiglu, [randn((3, 77), dtype, 2) * 4, randn((3, 77), dtype, 3)], dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("transposed", [False, True])
def test_rotary_gives_the_array_ops_bits(always, dtype, transposed):
    cos, sin = (Tensor(t) for t in tables(5, 8, dtype))
    if transposed:      # (B, H, N, d) over (B, N, H, d) memory, as heads() gives it
        fn = lambda x: ops.rotary(ops.transpose(x, (0, 2, 1, 3)), cos, sin)  # noqa: E731
        x = randn((2, 5, 3, 8), dtype, 4)
    else:
        fn, x = (lambda x: ops.rotary(x, cos, sin)), randn((2, 3, 5, 8), dtype, 4)
    assert_same(fn, [x], dtype, exact=True)


def test_finite_differences_with_the_kernels(always):
    check_grad(lambda x, w: ops.rms_norm(x, w, 0.5), randn((2, 3, 6), "float64", 5),
               randn(6, "float64", 6))
    check_grad(ops.swiglu, randn((4, 5), "float64", 7) * 3, randn((4, 5), "float64", 8))
    cos, sin = (Tensor(t) for t in tables(4, 6, "float64"))
    check_grad(lambda x: ops.rotary(ops.transpose(x, (0, 2, 1, 3)), cos, sin),
               randn((2, 4, 3, 6), "float64", 9))


def test_two_threads_give_the_same_bits(always, monkeypatch):
    from minipar.autograd import rows
    monkeypatch.setattr(fused_cpu, "SPLIT_ELEMENTS", 0)
    monkeypatch.setattr(rows, "MIN_ELEMENTS", 0)            # small arrays split too
    x, w = randn((64, 48), "float32", 11), randn(48, "float32", 12)
    q = randn((2, 16, 3, 48), "float32", 13).transpose(0, 2, 1, 3)
    cos, sin = tables(16, 48, "float32")

    def all_outputs():
        y, xhat, inv = fused_cpu.rmsnorm_forward(x, w)
        s, sigma = fused_cpu.swiglu_forward(x, y)
        return [y, *fused_cpu.rmsnorm_backward(x, xhat, inv, w), s,
                *fused_cpu.swiglu_backward(x, y, sigma, x), fused_cpu.rotary_forward(q, cos, sin),
                fused_cpu.rotary_backward(q, cos, sin)]

    assert_same_bits_at_1_and_2_threads(all_outputs)


def test_an_rmsnorm_rows_bits_do_not_depend_on_its_block():
    from minipar.kernels.cpu_loops_llama import LOOPS
    rows, d = 40, 33
    x, g, w = randn((rows, d), "float32", 21), randn((rows, d), "float32", 22), randn(d, "float32", 23)
    k = np.float32
    for name in ("rmsnorm_forward", "rmsnorm_backward"):
        outs = []
        for blocks in ([(0, rows)], [(r, r + 1) for r in range(rows)]):
            o = [np.empty_like(x), np.empty_like(x), np.empty((rows, 1), np.float32)]
            for lo, hi in blocks:
                if name == "rmsnorm_forward":
                    LOOPS[name](lo, hi, x, w, k(1 / d), k(1e-5), *o)
                else:
                    LOOPS[name](lo, hi, g, x, np.abs(x[:, :1]), w, k(1 / d), o[0])
            outs.append(o if name == "rmsnorm_forward" else o[:1])
        for whole, alone in zip(*outs):
            np.testing.assert_array_equal(whole, alone, err_msg=name)


def test_half_precision_and_odd_widths_take_the_array_code(always):
    big = np.zeros(fused_cpu.MIN_ELEMENTS, np.float16)
    for op in ("rmsnorm", "rotary", "swiglu"):
        assert ops_math.fused_kernels(op, big) is None
        assert ops_math.fused_kernels(op, big.astype(np.float32)) is fused_cpu
    gate, up = randn((4, 64), "float32", 31) * 4, randn((4, 64), "float32", 32)
    half = ops.swiglu(Tensor(gate.astype(np.float16)), Tensor(up.astype(np.float16))).numpy()
    g16, u16 = gate.astype(np.float16).astype(np.float32), up.astype(np.float16).astype(np.float32)
    silu = (g16 / (1 + np.exp(-g16))).astype(np.float16).astype(np.float32)
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), (silu * u16).astype(np.float16), rtol=1e-3)
    cos, sin = (Tensor(t) for t in tables(5, 7, "float64"))     # d = 7: the array code's halves
    x = randn((2, 5, 7), "float64", 33)
    assert_same(lambda x: ops.rotary(x, cos, sin), [x], "float64", exact=True)
