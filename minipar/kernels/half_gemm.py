"""Half-precision matrix products on the GPU through cuBLAS, accumulated in fp32.

The tensor-core contract of mixed precision (``autograd/ops_reduce._mm``) is: fp16 or bf16
inputs, products summed in fp32, one rounding of the result to half.  CuPy's ``matmul``
keeps it only for two-dimensional operands (``gemmEx``).  For three or more dimensions CuPy
14.2 casts both operands to fp32 and runs an fp32 batched GEMM without tensor cores (CuPy
PR 10317) — attention's q·kᵀ and P·v, a third of a GPT's GEMMs — and it fails outright on
bfloat16.  So minipar calls cuBLAS itself:

    C[b] = A[b] @ B[b] (+ bias)     b over the broadcast batch axes
    2-D: cublasGemmEx;  batched: cublasGemmStridedBatchedEx (one call for every b)
    Atype = Btype = Ctype = CUDA_R_16F or CUDA_R_16BF,  computeType = CUBLAS_COMPUTE_32F

cuBLAS is column-major.  A row-major matrix X (r × c, rows ``ld`` apart) is, read
column-major, Xᵀ (c × r) with leading dimension ld — so row-major C = A B is computed as
the column-major product Cᵀ = Bᵀ Aᵀ: cuBLAS's "A" is our B, its "B" is our A, m = n_cols(C),
n = rows(C).  An operand stored transposed (a ``swapaxes`` view, stride 1 along its rows) is
passed with op = T instead of being copied.  Batched operands need one stride between
consecutive matrices; a broadcast operand (a weight shared by the batch) has stride 0.
Anything else (e.g. q, k, v sliced out of the fused qkv projection) is copied contiguous.

A bias is added inside the GEMM: C is first filled with the broadcast bias and cuBLAS
computes α·A B + β·C with β = 1, so the bias too is added in fp32 before the one rounding.
"""
from __future__ import annotations

import numpy

from minipar.autograd import ops_reduce

_CUDA_TYPES = {"float16": "CUDA_R_16F", "bfloat16": "CUDA_R_16BF"}
_ONE = numpy.ones(1, dtype=numpy.float32)      # α and β are read from host memory
_ZERO = numpy.zeros(1, dtype=numpy.float32)    # (pointer mode host), fp32 for 32F compute


def _batch_stride(shape, strides):
    """One stride (in elements) that walks every matrix of these batch axes in order, or
    None.  Axes of length 1 are skipped; all-zero strides (a broadcast operand) give 0."""
    axes = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not axes or all(s == 0 for _, s in axes):
        return 0
    for (_, outer), (n, inner) in zip(axes, axes[1:]):
        if outer != inner * n:
            return None
    return axes[-1][1]


def _operand(xp, x, batch):
    """(array, transposed, ld, batch stride) for cuBLAS; ``array`` is ``x`` broadcast to the
    batch, copied contiguous only when its layout has no (ld, stride) description."""
    x = xp.broadcast_to(x, batch + x.shape[-2:])
    for attempt in range(2):
        rows, cols = x.shape[-2:]
        item = x.itemsize
        s_row, s_col = (s // item for s in x.strides[-2:])
        s_row = s_row if rows > 1 else max(cols, 1)    # a single row or column: any stride
        s_col = s_col if cols > 1 else 1
        stride = _batch_stride(x.shape[:-2], [s // item for s in x.strides[:-2]])
        if stride is not None and s_col == 1 and s_row >= max(cols, 1):
            return x, False, s_row, stride             # row-major: column-major Xᵀ
        if stride is not None and s_row == 1 and s_col >= max(rows, 1) and cols > 1:
            return x, True, s_col, stride              # column-major X: pass op = T
        x = xp.ascontiguousarray(x)
    raise AssertionError("a contiguous array always has a cuBLAS layout")


def half_matmul(a, b, bias=None):
    """a @ b (+ bias) for fp16/bf16 CuPy arrays of two or more dimensions (batch axes
    broadcast, as ``matmul``), summed in fp32 by cuBLAS and rounded to half once."""
    import cupy
    from cupy_backends.cuda.api import runtime
    from cupy_backends.cuda.libs import cublas

    if a.dtype != b.dtype or a.dtype.name not in _CUDA_TYPES:
        raise TypeError(f"half_matmul needs two fp16 or two bf16 arrays, got {a.dtype}, {b.dtype}")
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not fit")
    batch = tuple(numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    count = int(numpy.prod(batch))
    c = cupy.empty(batch + (m, n), dtype=a.dtype)
    beta = _ZERO
    if bias is not None:
        c[...] = bias                                  # the GEMM adds A B to it (β = 1)
        beta = _ONE
    if c.size == 0 or k == 0:                          # nothing to sum: C = bias or 0
        if bias is None:
            c[...] = 0
        return c
    a_, a_t, lda, stride_a = _operand(cupy, a, batch)
    b_, b_t, ldb, stride_b = _operand(cupy, b, batch)
    kind = getattr(runtime, _CUDA_TYPES[a.dtype.name])
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    op = lambda t: cublas.CUBLAS_OP_T if t else cublas.CUBLAS_OP_N  # noqa: E731
    # column-major Cᵀ (n × m) = Bᵀ (n × k) · Aᵀ (k × m)
    args_b = (b_.data.ptr, kind, ldb)
    args_a = (a_.data.ptr, kind, lda)
    if not batch:
        cublas.gemmEx(handle, op(b_t), op(a_t), n, m, k, _ONE.ctypes.data, *args_b, *args_a,
                      beta.ctypes.data, c.data.ptr, kind, n, cublas.CUBLAS_COMPUTE_32F,
                      cublas.CUBLAS_GEMM_DEFAULT)
    else:
        cublas.gemmStridedBatchedEx(
            handle, op(b_t), op(a_t), n, m, k, _ONE.ctypes.data, *args_b, stride_b,
            *args_a, stride_a, beta.ctypes.data, c.data.ptr, kind, n, m * n, count,
            cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)
    return c


ops_reduce.use_half_gemm(half_matmul)   # _mm calls it on the cupy backend
