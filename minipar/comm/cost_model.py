"""The α-β-γ cost model of collectives, calibrated by short exchanges; ``auto`` picks by it.

A message of n bytes costs α + n·β (α: latency incl. software overhead, β: seconds per
byte, 1/bandwidth); reducing n bytes costs n·γ.  For p ranks and S bytes:

    ring                2(p-1)·α + 2(p-1)/p·S·β + (p-1)/p·S·γ
    recursive doubling  log2 p'·(α + S·β + S·γ_shared)              (+ fold)
    rabenseifner        2·log2 p'·α + 2(p'-1)/p'·S·β + (p'-1)/p'·S·γ (+ fold)
    tree                2⌈log2 p⌉·(α + S·β) + ⌈log2 p⌉·S·γ
    hierarchical        ring RS(q) + ring AR(m, S/q) + ring AG(q)    (m nodes of q ranks)

with p' = 2^⌊log2 p⌋ and, when p' < p, the fold 2α + 2S·β + S·γ.  Pipelining a message
into k segments costs k·α instead of α.  Latency terms dominate small S (recursive
doubling wins), bandwidth terms large S (ring / Rabenseifner win).

Recursive doubling sums into the very buffer it has just sent: on one machine the
partner's copy has just pulled those cache lines to its core, and writing them first
takes them back, so that reduction runs far slower (γ_shared) than the others, which
sum into chunks nobody touched (γ).

``calibrate(comm)`` measures α, β (exchanges between ranks 0 and 1 through the minipar
transport, so Python overhead is part of them), γ and γ_shared,
and broadcasts them from rank 0: every rank must make the same ``auto`` choice.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass


from minipar.backend import xp
from minipar.comm.chunks import pow2_floor, segments
from minipar.comm.exchange import SEGMENT_BYTES, exchange, exchange_reduce

ALL_REDUCE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical")


@dataclass(frozen=True)
class CostParams:
    alpha: float = 5e-6     # s per message
    beta: float = 2e-10     # s per byte moved    (5 GB/s)
    gamma: float = 2e-10    # s per byte reduced  (5 GB/s)
    # s per byte reduced into a buffer the partner has just read (recursive doubling sends
    # the very buffer it then sums into); None: the same as gamma
    gamma_shared: float | None = None


def _ring(p, S, c, seg=SEGMENT_BYTES):
    if p == 1:
        return 0.0
    k = segments(S / p, seg)
    return (p - 1) * (k + 1) * c.alpha + 2 * (p - 1) / p * S * c.beta + (p - 1) / p * S * c.gamma


def _fold(p, S, c):
    return 0.0 if pow2_floor(p) == p else 2 * c.alpha + 2 * S * c.beta + S * c.gamma


def predict(algorithm, p, nbytes, c: CostParams, ranks_per_node=None, seg=SEGMENT_BYTES):
    """Predicted seconds for an all-reduce of ``nbytes`` over ``p`` ranks."""
    S = float(nbytes)
    if p == 1:
        return 0.0
    p2 = pow2_floor(p)
    L = int(math.log2(p2))
    if algorithm == "ring":
        return _ring(p, S, c, seg)
    if algorithm == "recursive_doubling":
        g = c.gamma_shared or c.gamma
        return L * (segments(S, seg) * c.alpha + S * c.beta + S * g) + _fold(p, S, c)
    if algorithm == "rabenseifner":
        return (L * c.alpha + sum(segments(S / 2 ** (i + 1), seg) * c.alpha for i in range(L))
                + 2 * (p2 - 1) / p2 * S * c.beta + (p2 - 1) / p2 * S * c.gamma + _fold(p, S, c))
    if algorithm == "tree":
        d = math.ceil(math.log2(p))
        return 2 * d * (c.alpha + S * c.beta) + d * S * c.gamma
    if algorithm == "hierarchical":
        q = min(ranks_per_node or p, p)
        m = math.ceil(p / q)
        ag = (q - 1) * c.alpha + (q - 1) / q * S * c.beta if q > 1 else 0.0
        rs = _ring(q, S, c, seg) - ag if q > 1 else 0.0
        return rs + _ring(m, S / q, c, seg) + ag
    raise ValueError(f"no cost model for {algorithm!r}")


def predict_broadcast(algorithm, p, nbytes, c: CostParams):
    d = math.ceil(math.log2(p)) if p > 1 else 0
    if algorithm == "binomial":
        return d * (c.alpha + nbytes * c.beta)
    return (d + p - 1) * c.alpha + 2 * (p - 1) / p * nbytes * c.beta


def choose(p, nbytes, c: CostParams, candidates=("ring", "recursive_doubling",
                                                 "rabenseifner", "tree")):
    """The candidate with the smallest predicted time (ties: first listed)."""
    return min(candidates, key=lambda a: predict(a, p, nbytes, c))


def _gamma(comm, peer, nbytes, reps=15):
    """Seconds to reduce ``nbytes`` inside an exchange step: best exchange_reduce of a
    buffer with itself (send is recv, as in recursive doubling) minus best plain
    exchange, both starting from a freshly written buffer.  On 2 cores this measures
    ~4 GB/s where an ``add`` on cached data runs at ~35 GB/s: the partner has just read
    the buffer, so writing the sum first takes every cache line back from its core.
    With the cached figure the model made recursive doubling (which reduces S bytes at
    p=2, ring S/2) look cheap up to ~200 KiB; measured, ring wins from 32 KiB up."""
    b = xp.ones(nbytes // 4, dtype=xp.float32)
    tmp = xp.empty_like(b)
    best = [float("inf"), float("inf")]
    for i in range(-3, reps):
        for k in (0, 1):
            b.fill(1)
            comm.sendrecv(b[:0], peer, tmp[:0], peer, 11)  # line the two ranks up
            t0 = time.perf_counter()
            if k == 0:
                exchange_reduce(comm, b, peer, b, peer, xp.add, tag=11)
            else:
                exchange(comm, b, peer, tmp, peer, tag=11)
            if i >= 0:
                best[k] = min(best[k], time.perf_counter() - t0)
    return max(best[0] - best[1], 1e-12 * nbytes)


def calibrate(comm, small=8, large=256 << 10, mid=64 << 10, reps=20) -> CostParams:
    """Collective: measure the constants between ranks 0 and 1, through the minipar
    transport (so Python's overhead is in them), and give every rank the same values:

    - α: one step of a collective on ``small`` bytes (send, receive, reduce, with the
      Python around them) — what each extra message of an algorithm costs;
    - β: one simultaneous exchange of ``large`` bytes (what a ring step does), minus α;
    - γ: a local ``add`` of ``mid`` bytes on cached data (ring, halving and tree reduce
      into chunks the partner has not touched);
    - γ_shared: ``_gamma``, reducing into the buffer the partner has just read (what
      recursive doubling does).
    """
    saved = comm.counters.as_dict()
    vals = xp.zeros(4, dtype=xp.float64)
    if comm.size > 1 and comm.rank < 2:
        peer = 1 - comm.rank
        a = xp.zeros(max(small // 4, 1), dtype=xp.float32)
        alpha = float("inf")
        for i in range(-3, reps):  # 3 untimed rounds first: connection setup, page faults
            comm.sendrecv(a[:0], peer, a[:0], peer, 11)       # line the two ranks up
            t0 = time.perf_counter()
            exchange_reduce(comm, a, peer, a, peer, xp.add, tag=11)
            if i >= 0:
                alpha = min(alpha, time.perf_counter() - t0)
        send, recv = xp.ones(large, dtype=xp.uint8), xp.zeros(large, dtype=xp.uint8)
        best = float("inf")
        for i in range(-3, max(3, reps // 2)):
            comm.sendrecv(send[:0], peer, recv[:0], peer, 11)   # line the two ranks up
            t0 = time.perf_counter()
            exchange(comm, send, peer, recv, peer, tag=11)
            if i >= 0:
                best = min(best, time.perf_counter() - t0)
        x, y = xp.ones(mid // 4, dtype=xp.float32), xp.ones(mid // 4, dtype=xp.float32)
        add = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            xp.add(x, y, out=x)
            add = min(add, time.perf_counter() - t0)
        vals[:] = (alpha, max((best - alpha) / large, 1e-12), max(add / mid, 1e-13),
                   _gamma(comm, peer, mid) / mid)
    if comm.size == 1:
        vals[:] = CostParams.alpha, CostParams.beta, CostParams.gamma, CostParams.gamma
    host = vals if not hasattr(vals, "get") else vals.get()
    comm.mpi.Bcast(host, root=0)  # setup only: every rank must hold identical constants
    for k, v in saved.items():
        setattr(comm.counters, k, v)
    return CostParams(*(float(v) for v in host))


def params(comm) -> CostParams:
    """The calibrated constants of ``comm`` (calibrating on first use; collective then).

    ``MINIPAR_COMM_ALPHA/BETA/GAMMA`` override the measurement (e.g. to model a real
    network from a single machine).
    """
    c = comm.cache.get("cost")
    if c is None:
        env = [os.environ.get(f"MINIPAR_COMM_{k}") for k in ("ALPHA", "BETA", "GAMMA")]
        if all(env):
            c = CostParams(*map(float, env))
        else:
            c = calibrate(comm)
        comm.cache["cost"] = c
    return c
