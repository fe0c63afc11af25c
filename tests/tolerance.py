"""How close two differently rounded results must be: the one rule every comparison of
float32, float16 or bfloat16 results in the tests goes through.

Sums in two orders.  A BLAS kernel's blocking, a thread split, a ring's chunk order or a
fused kernel each add the same n terms t_i in their own order.  Each result lies within
γ_n·Σ|t_i| of the exact sum, γ_n = n·u / (1 − n·u), u the unit roundoff of the type the
sum is accumulated in (2^-24 float32, 2^-11 float16, 2^-8 bfloat16, 2^-53 float64;
Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2), so two orders differ by

        |a − b| ≤ 2·γ_n·Σ|t_i|                                     (sums_tolerance)

The bound is relative to the *terms*, not to the result.  A sum that nearly cancels (0.01
from terms of size ~1) keeps an error of a few ulps of the terms, which is a large relative
error of the result: an element-wise ``rtol`` judges that rounding against the wrong scale
and fails on a machine whose BLAS blocks differently (seen: 6.7e-5 relative on one
element of 5,040 under OpenBLAS's Haswell kernels).

Many roundings composed.  Where Σ|t_i| is not at hand (a whole model's gradients, a loss
curve, a kernel against a float64 reference), the comparison is normwise:

        max |a − b| ≤ rtol · max(max |b|, floor)                   (assert_close_normwise)

with rtol ~1e-5 in float32, ~2e-3 in float16 (every parity test's targets).  Both checks can
fail: a dropped or doubled term moves a result by a whole term, far beyond either bound.

See a different rounding before CI does: ``OPENBLAS_CORETYPE=Haswell python -m pytest``
runs the suite on another set of BLAS kernels (the default is picked from the CPU).
"""
import numpy as np

UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
                 "bfloat16": 2.0 ** -8}


def unit_roundoff(dtype):
    """u of ``dtype``: half the distance from 1 to the next representable number."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    return UNIT_ROUNDOFF[name]


def sums_tolerance(dtype, terms, abs_sum):
    """2·γ_n·Σ|t_i|: how far two orders of the same ``terms``-term sum, accumulated in
    ``dtype``, may differ.  ``abs_sum`` is Σ|t_i| (an array, element by element, or one
    bound for all); for a matrix product A·B it is |A|·|B|."""
    nu = terms * unit_roundoff(dtype)
    assert nu < 0.5, f"{terms} terms in {dtype}: the bound says nothing (n·u = {nu:.2f})"
    return 2 * nu / (1 - nu) * np.asarray(abs_sum, dtype=np.float64)


def assert_sums_close(actual, desired, *, dtype, terms, abs_sum, err_msg=""):
    """Every element of ``actual`` within :func:`sums_tolerance` of ``desired``."""
    actual, desired = (np.asarray(a, dtype=np.float64) for a in (actual, desired))
    assert actual.shape == desired.shape, (actual.shape, desired.shape, err_msg)
    bound = np.broadcast_to(sums_tolerance(dtype, terms, abs_sum), desired.shape)
    error = np.abs(actual - desired)
    bad = ~(error <= bound)                       # NaN counts as bad
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, error / np.maximum(bound, 1e-300), 0)),
                             desired.shape)
        raise AssertionError(
            f"{err_msg} {bad.sum()} of {desired.size} elements differ by more than "
            f"2·γ_{terms}·Σ|t| in {np.dtype(dtype).name}; worst at {i}: "
            f"{actual[i]!r} vs {desired[i]!r}, |a-b| = {error[i]:.3g} > {bound[i]:.3g}")


def assert_close_normwise(actual, desired, rtol, *, floor=0.0, err_msg=""):
    """max |actual − desired| ≤ rtol · max(max |desired|, floor): rounding judged against
    the array's scale, not each element's (``floor`` for arrays that may be all ~0)."""
    actual, desired = (np.asarray(a, dtype=np.float64) for a in (actual, desired))
    assert actual.shape == desired.shape, (actual.shape, desired.shape, err_msg)
    if desired.size == 0:
        return
    scale = max(float(np.abs(desired).max()), floor)
    error = float(np.abs(actual - desired).max())
    if not error <= rtol * scale:                 # NaN fails
        raise AssertionError(f"{err_msg} max |a-b| = {error:.3g} > {rtol:g} · {scale:.3g} "
                             f"(relative {error / scale if scale else float('inf'):.3g})")
