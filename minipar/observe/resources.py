"""What this rank's machine offers a run: its GEMM rate, its memory budget, its GPU's
NVML handle.  ``RunMonitor`` reads them once at the start of a run (MFU's peak, the
memory share of each rank, the GPU's busy share)."""
from __future__ import annotations

import os
import time

from minipar import backend
from minipar.process.threads import current_budget


def measure_gemm_flops(seconds=0.2):
    """FLOP/s of a square float32 matmul (2n^3 FLOPs) on this rank, timed for ``seconds``,
    through the model's own matmul (split over the rank's threads when it has several)."""
    from minipar.autograd.rows import matmul
    n = 2048 if backend.backend_name() == "cupy" else 512
    a = backend.xp.ones((n, n), dtype=backend.xp.float32)
    matmul(a, a)                                   # warm-up: thread pools, kernels, caches
    backend.sync()
    count, t0 = 0, time.perf_counter()
    while count == 0 or time.perf_counter() - t0 < seconds:
        matmul(a, a)
        backend.sync()
        count += 1
    return 2 * n ** 3 * count / (time.perf_counter() - t0)


def memory_budget_bytes():
    """Bytes this rank may use: the GPU's memory, or its share of the RAM it may use."""
    if backend.backend_name() == "cupy":
        try:
            return int(backend.xp.cuda.runtime.memGetInfo()[1])
        except Exception:                               # no device query: unknown
            return 0
    limit = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                value = f.read().strip()
            if value.isdigit() and int(value) < 2 ** 60:    # "max" / huge: no limit
                limit = int(value)
                break
        except OSError:
            continue
    if limit is None:
        try:
            limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 0
    return limit // max(1, current_budget().ranks_on_node)


def _nvml_handle():
    """An NVML handle for this rank's GPU, or None (no CuPy, no nvidia-ml-py, no GPU)."""
    if backend.backend_name() != "cupy":
        return None
    try:
        import pynvml
        pynvml.nvmlInit()
        bus = backend.xp.cuda.Device().pci_bus_id
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus)
    except Exception:
        return None


def rank_memory_limit():
    """(bytes this rank may use, where the number comes from), for the check before a run:
    on GPU the device's *free* memory (other processes and the CuPy context already out),
    on CPU ``memory_budget_bytes`` (RAM or the cgroup limit, shared by the node's ranks).
    0 bytes: unknown."""
    if backend.backend_name() == "cupy":
        try:
            return int(backend.xp.cuda.runtime.memGetInfo()[0]), "free on this GPU"
        except Exception:
            return 0, "GPU memory unknown"
    ranks = max(1, current_budget().ranks_on_node)
    return memory_budget_bytes(), f"RAM / {ranks} rank{'s' if ranks > 1 else ''} on this node"
