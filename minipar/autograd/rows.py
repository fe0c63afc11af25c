"""Row blocks on a thread pool: the elementwise work of an op uses every core the rank owns.

BLAS spreads a matmul over the rank's threads by itself; a NumPy ufunc (``exp``,
``x - mean``, a row sum) runs on one core.  With one process on a 2-core machine the
second core sits idle for every LayerNorm, softmax and GELU of the step — about a third
of it.  Yet these ops are independent row by row: LayerNorm and softmax normalise each
row of their last axis on its own, GELU each element.  So a fused op is written once
as a *kernel over a block of rows* that writes into output arrays it is given,

    kernel(lo, hi)      computes rows [lo, hi) of the outputs from rows [lo, hi) of the inputs

and ``for_row_blocks(rows, kernel)`` cuts range(rows) into T equal blocks and runs
them on T threads (the calling thread takes the first).  NumPy releases the GIL inside
each ufunc loop and reduction, so the blocks really run at the same time.  Every row is
computed by the same code in the same order whatever T is, so the result is
bit-identical to one call on the whole array — the plain NumPy path, and the reference.

    T = the rank's thread budget (``minipar.process.threads``), 1 when ranks fill the cores
        (then nothing is threaded, and no thread is started); 1 for arrays smaller than
        ``MIN_ELEMENTS`` (measured: smaller ops gain nothing from a second thread, even
        with the spinning pool's ~5 µs hand-over, ``spin_pool.py``; a sleeping pool's
        ~70 µs is as much as a 1 M-element multiply); 1 on CuPy (the GPU runs every
        row in parallel already).

Sums over rows (a LayerNorm's dW = Σ_rows dy·x̂) are not row-independent: they stay
whole-array reductions on the calling thread, so they too keep their bits.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from minipar.autograd import spin_pool
from minipar.backend import backend_name, xp

MIN_ELEMENTS = 1 << 18

_spinning = None   # which pool splits go to; None: the spinning one where available
_pools = {}        # spinning (True/False) -> (pool, its worker count)
os.register_at_fork(after_in_child=_pools.clear)   # a forked child has none of the threads


def row_threads(elements):
    """How many threads a kernel over an array of ``elements`` values gets."""
    if elements < MIN_ELEMENTS or backend_name() != "numpy":
        return 1
    from minipar.process.threads import current_budget
    return max(1, current_budget().threads)


def use_spin_pool(on):
    """Hand blocks to the spinning pool (the default where ``spin_pool.available()``) or,
    with False, to a ``ThreadPoolExecutor`` (``benchmarks/step_time.py --ablate`` times both)."""
    global _spinning
    _spinning = bool(on) and spin_pool.available()


def _get_pool(workers):
    """The workers: a ``SpinPool`` (``spin_pool.py``: a block handed over in ~5 µs, not
    ~70) where numba is installed, else a ``ThreadPoolExecutor``."""
    spinning = spin_pool.available() if _spinning is None else _spinning
    pool, have = _pools.get(spinning, (None, 0))
    if pool is None or have < workers:
        if pool is not None and not spinning:
            pool.shutdown(wait=True)        # a SpinPool's old workers just go to sleep
        pool = (spin_pool.SpinPool(workers) if spinning else
                ThreadPoolExecutor(max_workers=workers, thread_name_prefix="minipar-rows"))
        _pools[spinning] = (pool, workers)
    return pool


def for_row_blocks(rows, kernel, elements, threads=None):
    """kernel(lo, hi) over blocks [lo, hi) that cover range(rows), on up to
    ``row_threads(elements)`` threads (or ``threads``); returns when every block is done."""
    threads = min(row_threads(elements) if threads is None else threads, rows)
    if threads <= 1:
        kernel(0, rows)
        return
    bounds = [rows * i // threads for i in range(threads + 1)]
    pool = _get_pool(threads - 1)
    if isinstance(pool, spin_pool.SpinPool):
        pool.run(kernel, bounds)
        return
    futures = [pool.submit(kernel, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:])]
    try:
        kernel(bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()          # re-raises a block's exception here


MIN_MATMUL_FLOPS = 1 << 25     # measured: 17 MFLOP 171 µs whole vs 202 split; 100 MFLOP 983 vs 576


def matmul_threads(a, b):
    """Threads for a @ b: the pool's, when the rank splits its matmuls itself."""
    if backend_name() != "numpy" or a.ndim < 2 or b.ndim < 2:
        return 1
    from minipar.process.threads import current_budget
    budget = current_budget()
    if not budget.splits_matmuls:
        return 1
    flops = 2 * a.size * b.shape[-1]
    return budget.threads if flops >= MIN_MATMUL_FLOPS else 1


def matmul(a, b):
    """a @ b, its output cut into blocks of rows over the pool (each block one call of
    a one-thread BLAS):

        (M, K) @ (K, N)        rows of a (M ≥ N) or columns of b (a weight's gradient,
                               Xᵀ·dY, has few rows and many columns)
        (B, ..., M, K) @ (K, N)          and
        (B, ..., M, K) @ (B, ..., K, N)  the leading batch axis

    Any other shape, or a rank whose BLAS threads itself, is one plain ``a @ b``."""
    threads = matmul_threads(a, b)
    if threads == 1:
        return a @ b
    if a.ndim == 2 and b.ndim == 2:
        out = xp.empty((a.shape[0], b.shape[1]), dtype=xp.result_type(a, b))
        if a.shape[0] >= b.shape[1]:
            kernel = lambda lo, hi: xp.matmul(a[lo:hi], b, out=out[lo:hi])  # noqa: E731
            for_row_blocks(a.shape[0], kernel, out.size, threads)
        else:
            kernel = lambda lo, hi: xp.matmul(a, b[:, lo:hi], out=out[:, lo:hi])  # noqa: E731
            for_row_blocks(b.shape[1], kernel, out.size, threads)
        return out
    if a.ndim >= 3 and (b.ndim == 2 or (b.ndim == a.ndim and b.shape[0] == a.shape[0])):
        batch = xp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        if batch[0] != a.shape[0]:            # b broadcasts a's leading axis: no split
            return a @ b
        out = xp.empty(batch + (a.shape[-2], b.shape[-1]), dtype=xp.result_type(a, b))
        if b.ndim == 2:
            kernel = lambda lo, hi: xp.matmul(a[lo:hi], b, out=out[lo:hi])  # noqa: E731
        else:
            kernel = lambda lo, hi: xp.matmul(a[lo:hi], b[lo:hi], out=out[lo:hi])  # noqa: E731
        for_row_blocks(a.shape[0], kernel, out.size, threads)
        return out
    return a @ b


def side_by_side_pays(a, b):
    """Whether two independent GEMMs the size of a @ b (Linear's backward: dX = dY·Wᵀ and
    dW = Xᵀ·dY) should run side by side, each whole on one of exactly two threads, rather
    than each split in two: one hand-over instead of two, and each GEMM keeps BLAS's full
    blocking.  Measured here at 2 threads, the backward of the small GPT's five Linear
    shapes (2048 rows; 128 -> 384, 128, 512, 256 and 512 -> 128): 10.9 ms in all, against
    11.6 ms with each GEMM split, and 11.0 ms for PyTorch's."""
    return matmul_threads(a, b) == 2


def side_by_side(first, second):
    """(first(), second()): ``second`` on the pool's worker while ``first`` runs here.
    Each must be plain array code (no split of its own: the worker is busy)."""
    results = [None, None]

    def block(lo, hi):
        results[lo] = (first if lo == 0 else second)()

    for_row_blocks(2, block, 0, threads=2)
    return results[0], results[1]


_EINSUM_DTYPES = (xp.dtype("float32"), xp.dtype("float64"))   # not bfloat16 (ml_dtypes)


def row_sum(a):
    """Σ over the last axis (keepdims).  ``einsum`` rather than ``a.sum(-1)``: NumPy's
    reduction pays bookkeeping per row, which dominates short rows (measured, (2048, 128)
    float32: 91 µs against 32 µs); einsum walks each row with one SIMD loop, in an order
    that does not depend on the other rows — so row blocks keep their bits."""
    if backend_name() != "numpy" or a.dtype not in _EINSUM_DTYPES:
        return a.sum(axis=-1, keepdims=True)
    return xp.einsum("...j->...", a)[..., None]


def row_dot(a, b):
    """Σ a·b over the last axis (keepdims), without the a·b temporary."""
    if backend_name() != "numpy" or a.dtype not in _EINSUM_DTYPES or b.dtype != a.dtype:
        return (a * b).sum(axis=-1, keepdims=True)
    return xp.einsum("...j,...j->...", a, b)[..., None]


def column_sums(m, dtype=None):
    """Σ over the rows of a 2-D ``m`` (a bias's or a LayerNorm's gradient), accumulated in
    ``dtype`` (default m's).  On a GPU as ``ones @ m`` (m first copied to ``dtype`` if it
    is narrower): a GEMV reads each row in order, where CuPy's axis-0 reduction gives each
    column a thread that strides down the rows (its reads never coalesce).  On NumPy,
    ``m.sum(axis=0)``: it adds the rows one after another, vectorised along each row."""
    dtype = dtype or m.dtype
    if backend_name() == "numpy":
        return m.sum(axis=0, dtype=dtype)
    return xp.ones(m.shape[0], dtype=dtype) @ m.astype(dtype, copy=False)


def column_dot(a, b):
    """Σ a·b over the rows of two 2-D arrays of one shape (LayerNorm's dW = Σ dy·x̂)."""
    if backend_name() == "numpy":
        return xp.einsum("ij,ij->j", a, b)
    return column_sums(a * b)

