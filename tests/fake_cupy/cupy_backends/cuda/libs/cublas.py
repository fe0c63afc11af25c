"""Fake ``cupy_backends.cuda.libs.cublas``: ``gemmEx`` and ``gemmStridedBatchedEx`` on raw
pointers, computed by NumPy in float32 (the accumulation of ``CUBLAS_COMPUTE_32F``).

A pointer is a host address here (``a.data.ptr``); the fake finds the live fake array that
holds the whole range the call reads or writes — else it stops, as an illegal address
would — and refuses what a GPU would misread silently: a data type that is not the
array's (``LaunchCheckError``).  cuBLAS's own refusals (a leading dimension shorter than a
column, an unknown type, device pointer mode with host scalars) raise ``CUBLASError``.
Every call is one kernel launch and one GEMM for ``cupy._counts``.  Column-major: element
(i, j) of an r × c matrix with leading dimension ld is at ptr + (i + j·ld)·itemsize.
"""
import ctypes

import numpy
from numpy.lib.stride_tricks import as_strided

import cupy
from cupy import LaunchCheckError, _counts

CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_POINTER_MODE_HOST, CUBLAS_POINTER_MODE_DEVICE = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT, CUBLAS_GEMM_DEFAULT_TENSOR_OP = -1, 99
_pointer_mode = {}


class CUBLASError(RuntimeError):
    pass


def _dtype(code):
    import ml_dtypes
    kinds = {cupy.cuda.runtime.CUDA_R_32F: numpy.float32, cupy.cuda.runtime.CUDA_R_16F: numpy.float16,
             cupy.cuda.runtime.CUDA_R_16BF: ml_dtypes.bfloat16}
    if code not in kinds:
        raise CUBLASError(f"CUBLAS_STATUS_NOT_SUPPORTED: data type {code}")
    return numpy.dtype(kinds[code])


def setPointerMode(handle, mode):
    _pointer_mode[handle] = mode


def getPointerMode(handle):
    return _pointer_mode.get(handle, CUBLAS_POINTER_MODE_HOST)


def _owner(ptr, nbytes):
    for w in list(cupy._live.values()):
        a = w._a
        if w._base is None and a.ctypes.data <= ptr and ptr + nbytes <= a.ctypes.data + a.nbytes:
            return a
    raise CUBLASError(f"illegal address: no device array holds {nbytes} bytes at {ptr:#x}")


def _matrices(ptr, code, rows, cols, ld, stride, count):
    """``count`` column-major rows × cols matrices at ptr, ``stride`` elements apart."""
    dtype = _dtype(code)
    if ld < max(rows, 1) or stride < 0:
        raise CUBLASError(f"CUBLAS_STATUS_INVALID_VALUE: ld {ld} < rows {rows} or stride {stride}")
    extent = ((count - 1) * stride + (cols - 1) * ld + rows) * dtype.itemsize
    owner = _owner(ptr, extent)
    if owner.dtype != dtype:
        raise LaunchCheckError(f"cuBLAS told {dtype} for a {owner.dtype} array")
    flat = numpy.frombuffer((ctypes.c_char * extent).from_address(ptr), dtype=dtype)
    item = dtype.itemsize
    return as_strided(flat, (count, rows, cols), (stride * item, item, ld * item), writeable=True)


def _gemm(name, handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
          strideB, beta, C, Ctype, ldc, strideC, count, computeType):
    if computeType != CUBLAS_COMPUTE_32F or getPointerMode(handle) != CUBLAS_POINTER_MODE_HOST:
        raise CUBLASError("the fake models CUBLAS_COMPUTE_32F with host alpha/beta only")
    a = _matrices(A, Atype, *((m, k) if transa == CUBLAS_OP_N else (k, m)), lda, strideA, count)
    b = _matrices(B, Btype, *((k, n) if transb == CUBLAS_OP_N else (n, k)), ldb, strideB, count)
    c = _matrices(C, Ctype, m, n, ldc, strideC, count)
    op = lambda x, t: x if t == CUBLAS_OP_N else x.transpose(0, 2, 1)  # noqa: E731
    alpha, beta = ctypes.c_float.from_address(alpha).value, ctypes.c_float.from_address(beta).value
    out = numpy.float32(alpha) * (op(a, transa).astype(numpy.float32) @ op(b, transb).astype(numpy.float32))
    if beta != 0:                        # β = 0: C is not read (it may hold anything)
        out += numpy.float32(beta) * c.astype(numpy.float32)
    c[...] = out.astype(c.dtype)
    _counts.launches += 1
    _counts.gemms.append((name, (2, 2) if name == "gemmEx" else (3, 3), (a.dtype.name, b.dtype.name)))


def gemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
           ldc, computeType, algo):
    _gemm("gemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
          beta, C, Ctype, ldc, 0, 1, computeType)


def gemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype,
                         ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    _gemm("gemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA,
          B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType)
