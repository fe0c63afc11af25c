"""Communication hooks: what DDP does with a full bucket of gradients.

A hook is ``hook(comm, flat) -> handle`` with ``handle.wait()`` returning the averaged
gradient (g = (1/n)·Σ_r g_r, n = comm.size).  The default is an all-reduce; gradient
compression (fp16/bf16 casts, int8, top-k, PowerSGD) replaces it without touching DDP.
"""
from __future__ import annotations

from minipar.comm import all_reduce_async


def allreduce_hook(algorithm="auto"):
    """g/n on every rank, then a non-blocking all-reduce (sum) of it."""
    def hook(comm, flat):
        flat *= 1.0 / comm.size
        return all_reduce_async(comm, flat, algorithm=algorithm)
    hook.name = f"allreduce({algorithm})"
    return hook
