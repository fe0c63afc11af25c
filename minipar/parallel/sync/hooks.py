"""Communication hooks: what DDP does with a full bucket of gradients.

A hook is ``hook(comm, flat) -> handle`` with ``handle.wait()`` returning the averaged
gradient (g = (1/n)·Σ_r g_r, n = comm.size); a handle with ``progress()`` is one the
caller advances (DDP calls it at every gradient hook).  The default is an all-reduce; gradient
compression (fp16/bf16 casts, int8, top-k, PowerSGD) replaces it without touching DDP.
"""
from __future__ import annotations

from minipar.comm import all_reduce_async
from minipar.comm.stepwise import all_reduce_stepped


def spare_core() -> bool:
    """Whether each rank has a core beyond its compute threads for a progress thread:
    cores ≥ ranks · (threads + 1).  Without one (ranks fill the cores), DDP advances
    its all-reduces itself at each gradient hook (``comm/stepwise.py``)."""
    from minipar.process.threads import current_budget
    b = current_budget()
    return b.cores >= b.ranks_on_node * (b.threads + 1)


def allreduce_hook(algorithm="auto"):
    """g/n on every rank, then a non-blocking all-reduce (sum) of it: on the progress
    thread where a core is free for it, else a ring the caller advances (``progress()``)."""
    def hook(comm, flat):
        flat *= 1.0 / comm.size
        if algorithm in ("auto", "ring") and not spare_core():
            return all_reduce_stepped(comm, flat)
        return all_reduce_async(comm, flat, algorithm=algorithm)
    hook.name = f"allreduce({algorithm})"
    return hook
