"""The tests' rounding rule (tests/tolerance.py) on sums whose order is known: it accepts
every order of the same float32 / float16 sums — including elements that nearly cancel,
where an element-wise rtol of 1e-5 does not — and rejects a dropped or doubled term."""
import numpy as np
import pytest

from tests.tolerance import (assert_close_normwise, assert_sums_close, sums_tolerance,
                             unit_roundoff)


def ordered_sums(terms, dtype):
    """Row sums of ``terms`` added left to right, right to left and pairwise, in ``dtype``."""
    t = terms.astype(dtype)
    forward, backward = np.zeros(len(t), dtype), np.zeros(len(t), dtype)
    for j in range(t.shape[1]):
        forward += t[:, j]
        backward += t[:, -1 - j]
    return t, [forward, backward, t.sum(axis=1, dtype=dtype)]


def nearly_cancelling(rows=5000, n=24, seed=0):
    """Rows of n terms of size ~1 whose sum is ~0.01 (the shape of the element Haswell's BLAS failed)."""
    t = np.random.default_rng(seed).standard_normal((rows, n))
    t[:, -1] -= t.sum(axis=1) - 0.01
    return t


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_every_order_of_the_same_sum_passes(dtype):
    t, (forward, backward, pairwise) = ordered_sums(nearly_cancelling(), dtype)
    abs_sum = np.abs(t.astype(np.float64)).sum(axis=1)
    for other in (backward, pairwise):
        assert_sums_close(other, forward, dtype=dtype, terms=t.shape[1], abs_sum=abs_sum)
    # the scale matters: judged element by element against the result, the orders disagree
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.abs(backward.astype(np.float64) - forward) / np.abs(forward.astype(np.float64))
    assert np.nanmax(relative) > (1e-5 if dtype == np.float32 else 2e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_dropped_or_doubled_term_fails(dtype):
    t, (forward, _, pairwise) = ordered_sums(nearly_cancelling(rows=50), dtype)
    abs_sum = np.abs(t.astype(np.float64)).sum(axis=1)
    dropped, doubled = pairwise.copy(), pairwise.copy()
    dropped[7] -= t[7, np.argmax(np.abs(t[7]))]          # a whole term: far beyond rounding
    doubled[11] += t[11, np.argmax(np.abs(t[11]))]
    for wrong in (dropped, doubled):
        with pytest.raises(AssertionError, match="1 of 50 elements"):
            assert_sums_close(wrong, forward, dtype=dtype, terms=t.shape[1], abs_sum=abs_sum)
    broken = pairwise.astype(np.float64)
    broken[0] = np.nan
    with pytest.raises(AssertionError):
        assert_sums_close(broken, forward, dtype=dtype, terms=t.shape[1], abs_sum=abs_sum)


def test_the_bound_is_higham_gamma_n():
    u = unit_roundoff(np.float32)
    assert u == 2.0 ** -24 and unit_roundoff(np.float16) == 2.0 ** -11
    assert sums_tolerance(np.float32, 24, 3.0) == pytest.approx(2 * 24 * u / (1 - 24 * u) * 3.0)
    with pytest.raises(AssertionError, match="says nothing"):
        sums_tolerance(np.float16, 4096, 1.0)          # n·u ≥ 1/2: no bound at all


def test_normwise_judges_against_the_largest_value():
    want = np.array([100.0, 1e-3, -50.0])
    assert_close_normwise(want + [0, 5e-4, 0], want, 1e-5)    # 5e-4 ≤ 1e-5·100 though 50% of 1e-3
    with pytest.raises(AssertionError, match="relative"):
        assert_close_normwise(want + [0, 2e-3, 0], want, 1e-5)
    with pytest.raises(AssertionError):
        assert_close_normwise([np.nan, 0, 0], want, 1e-5)
    assert_close_normwise([1e-7, 0.0], [0.0, 0.0], 1e-6, floor=1.0)   # all ~0: judged against 1
    with pytest.raises(AssertionError):
        assert_close_normwise([1e-7, 0.0], [0.0, 0.0], 1e-6)
