"""Launching the CUDA flash-attention kernels from CuPy.

The CUDA C lives beside this file: ``flash_attention.cu`` (fp32, one thread per row,
the reference line for line) and ``flash_attention_f16.cu`` (fp16 on tensor cores, with
its PTX helpers in ``flash_mma.cuh``).
Each is compiled once per head dimension by ``cupy.RawModule`` with ``compile_options(d)``:
``-DHEAD_DIM=d`` and the fp16 forward's key tile (NVRTC; CuPy caches the binary on disk).
This module only allocates, picks the kernel, computes the grid and the dynamic shared
memory, and launches:

    grid  = (ceil(N / rows per block), B·H),  one block per tile of rows of one head
            (backward: B·Hkv, one block per key tile of one KV head, looping over its
             G = H/Hkv query heads: grouped-query attention with K/V read in place)
    dq    = fp32 zeros, accumulated by atomics from every key block, cast at the end
    D     = rowsum(dO ∘ O), computed here with array ops before the backward kernel

The tile sizes below must equal the ``#define``s of the .cu/.cuh files; the fp16 forward's
key tile is not a ``#define`` there but is passed in by ``compile_options``.
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
SOURCES = {"f32": KERNEL_DIR / "flash_attention.cu", "f16": KERNEL_DIR / "flash_attention_f16.cu"}

F32_BLOCK_Q, F32_BLOCK_K, F32_BWD_BLOCK = 64, 32, 32
TC_THREADS, TC_BLOCK_Q, TC_BWD_BLOCK_K, TC_BWD_BLOCK_Q = 128, 64, 64, 32
TENSOR_CORE_HEAD_DIMS = (32, 64, 96, 128)
FP32_MAX_HEAD_DIM = 128


def forward_block_k(head_dim):
    """Keys per K/V tile of the fp16 forward (``TC_FWD_BLOCK_K``): 128 up to d = 64, else 64.

    A 128-key tile halves the loop's iterations, barriers and softmax rescales, and costs
    each thread 64 more fp32 scores in registers and the block twice the shared memory
    (2 stages × {K, V} × keys × d halves).  ptxas (nvcc 13.0), sm_80 / sm_90, 0 spills either way:
        d =  32:  80 /  75 registers with 64 keys -> 129 / 130 with 128 keys;  16 -> 32 KiB
        d =  64: 128 / 124 -> 178 / 182;  32 -> 64 KiB
        d =  96: 160 / 133 -> 175 / 185;  48 -> 96 KiB
        d = 128: 171 / 174 -> 238 / 242;  64 -> 128 KiB
    Blocks (4 warps) resident per SM, from 64K registers (256 per warp granule) and 164 KiB
    (A100) or 228 KiB (H100) of shared memory, 1 KiB reserved per block; 64 -> 128 keys:
        d = 32: 6 -> 3,   d = 64: 4 -> 2,   d = 96: 3 -> 1 (A100), 3 -> 2 (H100),   d = 128: 2 -> 1.
    Up to d = 64 the big tile still leaves at least two blocks per SM, so one computes while
    another waits at a barrier.  From d = 96 on its shared memory leaves a single block on
    an A100 (on an H100 too at d = 128), whose every barrier idles the SM; there the 64-key
    tile keeps two or three.  (Occupancy reasoning, not a timing: benchmarks/gpu_checks.sh
    times the kernels on a GPU.)
    """
    return 128 if head_dim <= 64 else 64


def compile_options(head_dim):
    """The ``-D`` options every build of the kernels takes (NVRTC, nvcc, the CPU emulator)."""
    return (f"-DHEAD_DIM={head_dim}", f"-DTC_FWD_BLOCK_K={forward_block_k(head_dim)}")


def supports(dtype, head_dim):
    """Whether a kernel exists for this dtype and head dim (else the array reference runs)."""
    name = str(dtype)
    if name == "float16":
        return head_dim in TENSOR_CORE_HEAD_DIMS
    if name == "float32":
        return 1 <= head_dim <= FP32_MAX_HEAD_DIM
    return False


def shared_memory_bytes(kernel, head_dim):
    """Dynamic shared memory of each kernel, mirroring the layouts documented in the .cu files."""
    d = head_dim
    if kernel == "flash_forward_f32":
        return 4 * (F32_BLOCK_Q * (d + 1) + 2 * F32_BLOCK_K * d + F32_BLOCK_Q * (F32_BLOCK_K + 1))
    if kernel == "flash_backward_f32":
        b = F32_BWD_BLOCK
        return 4 * (4 * b * (d + 1) + 2 * b * d + b * (b + 1) + 2 * b)
    # fp16 tiles: swizzled rows of d halves, no padding (flash_mma.cuh)
    if kernel == "flash_forward_f16":
        return 2 * (2 * 2 * forward_block_k(d) * d)  # 2 stages (double buffering) × {K, V}
    if kernel == "flash_backward_f16":
        keys, queries = TC_BWD_BLOCK_K, TC_BWD_BLOCK_Q
        halves = (2 * keys + 2 * 2 * queries) * d + queries * keys  # K, V, 2 × {Q, dO}, dS
        return 2 * halves + 4 * 2 * 2 * queries  # 2 stages × {L, D}
    raise ValueError(kernel)


def paste_includes(cuda_source, filename=None):
    """``#include "x.cuh"`` lines replaced by the header itself (from this folder, its own
    includes pasted too), so NVRTC needs no include path and CuPy's cache key (the source
    text) covers the headers.  With ``filename``, ``#line`` markers keep compiler messages
    pointing at the real files."""
    lines = [f'#line 1 "{filename}"'] if filename else []
    for number, line in enumerate(cuda_source.splitlines(), start=1):
        included = re.fullmatch(r'#include "(\w+\.cuh)"', line.strip())
        if not included:
            lines.append(line)
            continue
        header = included.group(1)
        lines.append(paste_includes((KERNEL_DIR / header).read_text(), header if filename else None).rstrip("\n"))
        lines += [f'#line {number + 1} "{filename}"'] if filename else []
    return "\n".join(lines) + "\n"


def kernel_source(kind):
    """The source of ``kind`` ("f32" or "f16") as NVRTC compiles it."""
    return paste_includes(SOURCES[kind].read_text(), SOURCES[kind].name)


@functools.lru_cache(maxsize=None)
def _module(kind, head_dim):
    import cupy
    return cupy.RawModule(code=kernel_source(kind), options=compile_options(head_dim))


@functools.lru_cache(maxsize=None)
def get_kernel(name, head_dim):
    """The compiled kernel (a ``cupy.RawKernel``)."""
    return _module(name.rsplit("_", 1)[1], head_dim).get_function(name)


class CupyKernels:
    """The real thing: CuPy arrays, kernels compiled by NVRTC.  ``emulator.EmulatedKernels``
    has the same three members and runs the same .cu source on the CPU."""

    @property
    def xp(self):
        import cupy
        return cupy

    @staticmethod
    def get(name, head_dim):
        return get_kernel(name, head_dim)

    @staticmethod
    def address(array):
        return array.data.ptr


def _launch(kernels, name, head_dim, grid, threads, arrays, n_queries, n_keys, causal, group):
    """Every kernel takes (arrays..., n_queries, n_keys, causal, scale, group) as int32/fp32
    scalars; ``group`` = query heads per KV head.
    Above 48 KiB of dynamic shared memory a kernel must opt in (sm_70 and later)."""
    xp = kernels.xp
    scalars = (xp.int32(n_queries), xp.int32(n_keys), xp.int32(bool(causal)),
               xp.float32(1.0 / math.sqrt(head_dim)), xp.int32(group))
    kernel, shared = kernels.get(name, head_dim), shared_memory_bytes(name, head_dim)
    if shared > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < shared:
        kernel.max_dynamic_shared_size_bytes = shared
    kernel(grid, (threads,), tuple(arrays) + scalars, shared_mem=shared)


def _prepared(kernels, a):
    """C-contiguous and 16-byte aligned, as the kernels' vector loads require."""
    a = kernels.xp.ascontiguousarray(a)
    return a if kernels.address(a) % 16 == 0 else a.copy()


def _suffix(dtype):
    return "f16" if str(dtype) == "float16" else "f32"


def forward(q, k, v, causal=True, kernels=None):
    """(out, lse): out like q, lse (B, H, Nq) fp32; k, v may have H/G heads (grouped-query).
    ``kernels``: default ``CupyKernels()``."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    q, k, v = (_prepared(kernels, a) for a in (q, k, v))
    batch, heads, n_queries, head_dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    out = xp.zeros_like(q)
    lse = xp.full((batch, heads, n_queries), -xp.inf, dtype=xp.float32)
    if out.size == 0 or n_keys == 0:
        return out, lse
    name = "flash_forward_" + _suffix(q.dtype)
    rows, threads = (TC_BLOCK_Q, TC_THREADS) if name.endswith("f16") else (F32_BLOCK_Q, F32_BLOCK_Q)
    grid = ((n_queries + rows - 1) // rows, batch * heads)
    _launch(kernels, name, head_dim, grid, threads, (q, k, v, out, lse), n_queries, n_keys, causal,
            heads // kv_heads)
    return out, lse


def backward(q, k, v, out, lse, grad_out, causal=True, kernels=None):
    """(dq, dk, dv) in q's dtype, dk and dv shaped like k; dq goes through an fp32 buffer of
    atomic adds, dk and dv are each written once by the block that owns their KV head."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    q, k, v, out, grad_out = (_prepared(kernels, a) for a in (q, k, v, out, grad_out))
    lse = _prepared(kernels, lse.astype(xp.float32, copy=False))
    batch, heads, n_queries, head_dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    delta = (grad_out.astype(xp.float32) * out.astype(xp.float32)).sum(axis=-1)
    dq = xp.zeros(q.shape, dtype=xp.float32)
    dk, dv = xp.zeros_like(k), xp.zeros_like(v)
    if q.size == 0 or k.size == 0:
        return dq.astype(q.dtype), dk, dv
    name = "flash_backward_" + _suffix(q.dtype)
    keys, threads = (TC_BWD_BLOCK_K, TC_THREADS) if name.endswith("f16") else (F32_BWD_BLOCK, F32_BWD_BLOCK)
    grid = ((n_keys + keys - 1) // keys, batch * kv_heads)
    _launch(kernels, name, head_dim, grid, threads, (q, k, v, grad_out, lse, delta, dq, dk, dv),
            n_queries, n_keys, causal, heads // kv_heads)
    return dq.astype(q.dtype, copy=False), dk, dv
