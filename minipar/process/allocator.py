"""Keep freed activation buffers for reuse, so a step does not pay page faults for them.

A training step allocates and frees the same arrays every step: activations of a few
MiB each (batch · seq · d_model · 4 bytes = 2 MiB for the benchmark model), their
gradients, the temporaries of every elementwise op.  glibc's ``malloc`` serves a
block larger than its *mmap threshold* with a fresh ``mmap`` and gives it back to the
kernel with ``munmap`` when NumPy frees it.  The next step's array of the same size
then starts as untouched pages, and its first write takes one page fault per 4 KiB:

    2 MiB = 512 faults  ≈  0.5-1 ms,   against ≈ 0.1 ms to compute  x - mean

Measured here (benchmarks/step_time.py, 4 layers, d 256, seq 256, batch 8, one
thread): LayerNorm's forward took 5.7 ms a call inside the step against 0.8 ms
alone, and the whole step went from 490 to 425 ms with the setting below.

The setting: raise the mmap threshold to its largest value (32 MiB on 64-bit glibc),
so such blocks come from the heap, and raise the trim threshold, so the heap does
not hand its free top back to the kernel after every step.  Freed blocks stay
mapped and the next step reuses them; the process's resident memory is about one
step's peak, which the step reaches anyway.  This is what PyTorch's CPU caching
allocator and jemalloc's retained extents buy too; ``torch`` users set it with
``MALLOC_MMAP_THRESHOLD_`` or preload jemalloc, minipar sets it itself in
``setup_process()`` (``process/__init__.py``; a user never needs an environment variable for speed).

Only glibc has ``mallopt``; elsewhere (macOS, musl) nothing is changed.  A user who
set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` has chosen: nothing is
changed either.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1      # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20     # glibc's cap on 64-bit: 4 · 1024 · 1024 · sizeof(long)
TRIM_THRESHOLD = 1 * 2**30
USER_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_applied = None


def keep_freed_blocks() -> bool:
    """Set glibc's mmap and trim thresholds (once per process); True if they were set."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if any(v in os.environ for v in USER_VARS):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
                    and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied


def describe() -> str:
    return ("freed blocks up to 32 MiB kept for reuse (glibc mallopt)" if _applied
            else "system allocator defaults")
