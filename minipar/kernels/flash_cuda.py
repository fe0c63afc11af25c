"""Launching the CUDA flash-attention kernels from CuPy.

The CUDA C lives beside this file: ``flash_attention.cu`` (fp32, one thread per row,
the reference line for line) and ``flash_attention_f16.cu`` (fp16 and bf16 on tensor
cores, one template per direction instantiated for each type, with its PTX helpers in
``flash_mma.cuh``).  A kernel's name ends in its kind: ``flash_forward_bf16``.
Each file is compiled once per head dimension by ``cupy.RawModule`` with
``nvrtc_options(kind, d)``: ``-DHEAD_DIM=d`` and the tensor-core forward's key tile
(``compile_options``), and for the tensor-core file ``-ftz=true`` (NVRTC; CuPy caches the
binary on disk).
This module only allocates, picks the kernel, computes the grid and the dynamic shared
memory, and launches:

    grid  = (ceil(N / rows per block), B·H),  one block per tile of rows of one head
            (backward: B·Hkv, one block per key tile of one KV head, looping over its
             G = H/Hkv query heads: grouped-query attention with K/V read in place)
    out, lse, dk, dv   allocated, not zero-filled: every kernel writes every element
                       (a row that sees no key writes 0 and L = -inf)
    dq    = fp32 zeros, accumulated by atomics from every key block, cast at the end
    D     = rowsum(dO ∘ O), computed here with array ops before the backward kernel

The tile sizes below must equal the ``#define``s of the .cu/.cuh files; the tensor-core
forward's key tile is not a ``#define`` there but is passed in by ``compile_options``.
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
SOURCES = {"f32": KERNEL_DIR / "flash_attention.cu", "f16": KERNEL_DIR / "flash_attention_f16.cu",
           "bf16": KERNEL_DIR / "flash_attention_f16.cu"}  # kind -> file; f16 and bf16 share one
KINDS = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}  # dtype name -> kind
TENSOR_CORE_KINDS = ("f16", "bf16")

F32_BLOCK_Q, F32_BLOCK_K, F32_BWD_BLOCK = 64, 32, 32
TC_THREADS, TC_BLOCK_Q, TC_BWD_BLOCK_K, TC_BWD_BLOCK_Q = 128, 64, 64, 32
TENSOR_CORE_HEAD_DIMS = (32, 64, 96, 128)
FP32_MAX_HEAD_DIM = 128


def forward_block_k(head_dim):
    """Keys per K/V tile of the fp16 forward (``TC_FWD_BLOCK_K``): 128 up to d = 64, else 64.

    A 128-key tile halves the loop's iterations, barriers and softmax rescales, and costs
    each thread 64 more fp32 scores in registers and the block twice the shared memory
    (2 stages × {K, V} × keys × d halves).  ptxas (nvcc 13.0, ``nvrtc_options``), sm_80 / sm_90,
    0 spills either way:
        d =  32:  84 /  80 registers with 64 keys -> 140 / 139 with 128 keys;  16 -> 32 KiB
        d =  64: 132 / 104 -> 143 / 191;  32 -> 64 KiB
        d =  96: 136 / 134 -> 181 / 179;  48 -> 96 KiB
        d = 128: 182 / 176 -> 252 / 255;  64 -> 128 KiB
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


def nvrtc_options(kind, head_dim):
    """What NVRTC compiles ``kind``'s file with: ``compile_options``, and for the tensor-core
    kernels ``-ftz=true``, fp32 subnormals (below 2^-126) flushed to zero.  Their inputs and
    outputs are fp16/bf16 rounded to 11 or 8 bits; a probability or score that small changes
    no output bit, and flushing it lets ``exp2f`` be the one ``ex2.approx.ftz`` instruction
    and divisions skip their subnormal path.  The fp32 kernel, the reference line for line,
    keeps IEEE subnormals.  (The CPU emulator computes with subnormals, as g++ does.)"""
    return compile_options(head_dim) + (("-ftz=true",) if kind in TENSOR_CORE_KINDS else ())


def supports(dtype, head_dim):
    """Whether a kernel exists for this dtype and head dim (else the array reference runs)."""
    return missing_kernel(dtype, head_dim) is None


def missing_kernel(dtype, head_dim):
    """Why no kernel takes this dtype and head dim, in a few words; None when one does."""
    kind = KINDS.get(str(dtype))
    if kind is None:
        return f"no {dtype} kernel (fp32, fp16 and bf16 have one)"
    if kind in TENSOR_CORE_KINDS and head_dim not in TENSOR_CORE_HEAD_DIMS:
        return f"the {dtype} kernel takes head dim {', '.join(map(str, TENSOR_CORE_HEAD_DIMS))}, not {head_dim}"
    if kind == "f32" and not 1 <= head_dim <= FP32_MAX_HEAD_DIM:
        return f"the float32 kernel takes head dim up to {FP32_MAX_HEAD_DIM}, not {head_dim}"
    return None


def shared_memory_bytes(kernel, head_dim):
    """Dynamic shared memory of each kernel, mirroring the layouts documented in the .cu files."""
    d = head_dim
    if kernel == "flash_forward_f32":
        return 4 * (F32_BLOCK_Q * (d + 1) + 2 * F32_BLOCK_K * d + F32_BLOCK_Q * (F32_BLOCK_K + 1))
    if kernel == "flash_backward_f32":
        b = F32_BWD_BLOCK
        return 4 * (4 * b * (d + 1) + 2 * b * d + b * (b + 1) + 2 * b)
    # tensor-core tiles: swizzled rows of d 16-bit values, no padding (flash_mma.cuh)
    if kernel in ("flash_forward_f16", "flash_forward_bf16"):
        return 2 * (2 * 2 * forward_block_k(d) * d)  # 2 stages (double buffering) × {K, V}
    if kernel in ("flash_backward_f16", "flash_backward_bf16"):
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
    """The source of ``kind`` ("f32", "f16" or "bf16") as NVRTC compiles it."""
    return paste_includes(SOURCES[kind].read_text(), SOURCES[kind].name)


def kind_of(kernel_name):
    """``flash_forward_bf16`` -> ``bf16``."""
    return kernel_name.rsplit("_", 1)[1]


@functools.lru_cache(maxsize=None)
def _module(source_path, head_dim):
    import cupy
    kind = next(k for k, path in SOURCES.items() if path == source_path)
    return cupy.RawModule(code=kernel_source(kind), options=nvrtc_options(kind, head_dim))


@functools.lru_cache(maxsize=None)
def get_kernel(name, head_dim):
    """The compiled kernel (a ``cupy.RawKernel``); the f16 and bf16 kernels of one head dim
    come from one module, as they come from one file."""
    return _module(SOURCES[kind_of(name)], head_dim).get_function(name)


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




def forward(q, k, v, causal=True, kernels=None):
    """(out, lse): out like q, lse (B, H, Nq) fp32; k, v may have H/G heads (grouped-query).
    ``kernels``: default ``CupyKernels()``."""
    kernels = kernels or CupyKernels()
    xp = kernels.xp
    q, k, v = (_prepared(kernels, a) for a in (q, k, v))
    batch, heads, n_queries, head_dim = q.shape
    kv_heads, n_keys = k.shape[1], k.shape[2]
    if q.size == 0 or n_keys == 0:  # no launch: no row sees a key, so out = 0 and L = -inf
        return xp.zeros_like(q), xp.full((batch, heads, n_queries), -xp.inf, dtype=xp.float32)
    out = xp.empty_like(q)  # the kernel writes every element of out and lse
    lse = xp.empty((batch, heads, n_queries), dtype=xp.float32)
    kind = KINDS[str(q.dtype)]
    rows, threads = (TC_BLOCK_Q, TC_THREADS) if kind in TENSOR_CORE_KINDS else (F32_BLOCK_Q, F32_BLOCK_Q)
    grid = ((n_queries + rows - 1) // rows, batch * heads)
    _launch(kernels, "flash_forward_" + kind, head_dim, grid, threads, (q, k, v, out, lse), n_queries, n_keys, causal,
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
    dq = xp.zeros(q.shape, dtype=xp.float32)  # a sum of atomic adds: starts at 0
    if q.size == 0 or k.size == 0:  # no launch: no query sees a key, every gradient is 0
        return dq.astype(q.dtype), xp.zeros_like(k), xp.zeros_like(v)
    dk, dv = xp.empty_like(k), xp.empty_like(v)  # the kernel writes every element
    kind = KINDS[str(q.dtype)]
    keys, threads = (TC_BWD_BLOCK_K, TC_THREADS) if kind in TENSOR_CORE_KINDS else (F32_BWD_BLOCK, F32_BWD_BLOCK)
    grid = ((n_keys + keys - 1) // keys, batch * kv_heads)
    _launch(kernels, "flash_backward_" + kind, head_dim, grid, threads, (q, k, v, grad_out, lse, delta, dq, dk, dv),
            n_queries, n_keys, causal, heads // kv_heads)
    return dq.astype(q.dtype, copy=False), dk, dv
