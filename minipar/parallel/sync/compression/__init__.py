"""Gradient compression as data-parallel communication hooks.

Data parallelism sends every gradient every step: 2(n-1)/n·4Ψ bytes per rank for Ψ
fp32 parameters, whatever the batch.  When the network is slower than the compute, a
hook can send less and still give every replica the same averaged gradient:

    method     what travels (bucket of L elements, n ranks)      bytes vs fp32 all-reduce
    fp16/bf16  half(g/n), all-reduced                              1/2
    int8       int8 values + a scale per 256, all-gathered        ≈ n/8 · (1 + 4/256)
    topk       the k = ρL largest (index, value) pairs, all-gathered   n·ρ
    powersgd   rank-r P (n×r) and Q (m×r) per matrix, all-reduced     (n+m)·r / (n·m)

Quantisation and sparsification are biased: what is not sent would be lost.  **Error
feedback** keeps it: each rank sends C(g + e) and keeps e ← (g + e) − C(g + e), so over
T steps

    Σ_t sent_t + e_T = Σ_t g_t        (exactly, on every rank)

— the applied updates trail the true gradients by the residual only, which stays bounded.

Use::

    hook = make_hook("powersgd", rank=4, start=10)
    sync = DDPSync(model, comm, comm_hook=hook)
    hook.bind(sync)                       # stateful hooks learn the buckets
    ... training steps ...
    hook.pop_stats()  -> {"wire_bytes", "dense_bytes", "compression_ratio"} of the step
    hook.state_dict() -> {key: numpy array}; hook.load_state_dict(state)   (per dp rank)

Modules: ``wire`` (byte formulas), ``base`` (bucket identification, progress thread,
counting, residuals, state), ``cast``, ``int8``, ``topk``, ``powersgd``.
"""
from __future__ import annotations

from minipar.parallel.sync.compression.base import CompressionHook
from minipar.parallel.sync.compression.cast import CastHook
from minipar.parallel.sync.compression.int8 import Int8Hook
from minipar.parallel.sync.compression.powersgd import PowerSGDHook
from minipar.parallel.sync.compression.topk import TopKHook

METHODS = ("none", "fp16", "bf16", "int8", "topk", "powersgd")


def make_hook(method, *, ratio=0.01, rank=4, start=None, error_feedback=True,
              chunk=256, algorithm="ring", seed=0):
    """The comm hook of ``method`` (one of ``METHODS``); None for "none" (DDP's default
    all-reduce).  ``ratio``: top-k's kept fraction; ``rank``: PowerSGD's rank;
    ``start``: uncompressed warm-up steps (default 10 for powersgd, 0 otherwise);
    ``chunk``: int8 elements per scale; ``algorithm``: of the all-reduces inside."""
    if method == "none":
        return None
    if method in ("fp16", "bf16"):
        return CastHook(method, algorithm=algorithm)
    if method == "int8":
        return Int8Hook(chunk, error_feedback, algorithm, start or 0)
    if method == "topk":
        return TopKHook(ratio, error_feedback, algorithm, start or 0)
    if method == "powersgd":
        return PowerSGDHook(rank, 10 if start is None else start, seed, error_feedback, algorithm)
    raise ValueError(f"unknown gradient compression {method!r}; choose one of {', '.join(METHODS)}")


__all__ = ["METHODS", "make_hook", "CompressionHook", "CastHook", "Int8Hook", "TopKHook",
           "PowerSGDHook"]
