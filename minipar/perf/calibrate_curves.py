"""``minipar calibrate``'s collective curves: seconds against bytes, for the layout model.

Run under ``mpiexec`` by ``calibrate.calibrate`` when there are several ranks: curves for
the whole group (all-reduce, all-gather, reduce-scatter and send/recv against bytes),
each collective timed right after some compute, as training calls it (``comm_curves``).
``perf/comm.py`` prices a layout's communication from them.  The other measurements of
communication: the links' α-β-γ constants that ``auto`` chooses by
(``calibrate_links.py``), and ZeRO-3's bookkeeping per unit, timed on the model's
miniature (``calibrate_model.zero3_unit_overhead``).
"""
from __future__ import annotations

import statistics
import time

from minipar import backend
from minipar.backend import xp

SIZES = (4 << 10, 64 << 10, 1 << 20, 8 << 20)
# the curves' sizes: SIZES and 256 KiB, where tensor parallelism's activations of the small
# presets fall.  Without it a log-log line from 64 KiB (1.5 ms, mostly waiting for the other
# rank) to 1 MiB put a 512 KiB all-reduce across the simulated cluster's link at 8.7 ms, and
# dp2 x tp2 with tp across nodes 21-31% above its measured step; with it, within 7% (5 runs)
CURVE_SIZES = tuple(sorted(SIZES + (256 << 10,)))


def _time_after(fn, work, reps=7, gaps=None):
    """Median seconds of ``fn()`` alone, each call right after ``work()``; ``gaps``: a list
    to append the seconds from the end of one call to the start of the next to (the
    link's idle time before each, which a shaped link turns into burst: perf/comm.py)."""
    work()
    fn()
    out = []
    end = time.perf_counter()
    for _ in range(reps):
        work()
        t0 = time.perf_counter()
        fn()
        backend.sync()
        if gaps is not None:
            gaps.append(t0 - end)
        end = time.perf_counter()
        out.append(end - t0)
    return statistics.median(out)


def comm_curves(comm, sizes=CURVE_SIZES, work=None, placement="intra", peer_distance=1, gaps=None):
    """{kind: {"p:PLACEMENT": [[bytes, s]]}} for the whole group, slowest rank, median;
    send/recv between rank r and r XOR ``peer_distance`` (q: a rank on the next node).
    ``gaps``: a list that collects the idle seconds before each timed call.

    Timed as training calls them: each collective right after some compute (``work``,
    by default a GEMM of 256 × 256 · 256 × 1024, ~0.1 GFLOP), with no barrier before it.
    So a curve includes what a barrier-synchronised loop hides: waiting for the other
    rank, whose compute ran a little slower this time, and buffers that compute has
    just pushed out of cache.  Measured on the 2-core development machine, an all-reduce
    took 2.3x its barrier-synchronised time at 64 KiB and 1.4x at 1 MiB: the sizes
    tensor parallelism's collectives have there.

    The all-reduce is the ring, the one training runs: tensor parallelism's regions use
    it (``parallel/tensor/regions.ALGORITHM``: bit-identical on every rank), and so do
    DDP's buckets where the ranks fill the cores (``sync/hooks.py``: stepped by
    backward).  ``auto`` would time the cost model's choice instead — on the simulated
    cluster, with the default constants, Rabenseifner's: 16 ms for a 1 MiB all-reduce
    over 2 nodes x 2 ranks against the ring's 10-12 ms in training, and 170-190 ms
    against 92 ms at 7.4 MB, which put tp4's and dp4's predicted steps 30-55% high."""
    from mpi4py import MPI
    from minipar.comm import all_gather, all_reduce, reduce_scatter
    from minipar.parallel.tensor.regions import ALGORITHM
    if work is None:
        a, w = xp.ones((256, 256), dtype=xp.float32), xp.ones((256, 1024), dtype=xp.float32)
        work = lambda: a @ w  # noqa: E731
    p = comm.size
    out = {k: {} for k in ("all_reduce", "all_gather", "reduce_scatter", "p2p")}
    for n in sizes:
        buf = xp.ones(n // 4, dtype=xp.float32)
        part = buf[: buf.size // p]
        peer = comm.rank ^ peer_distance
        fns = {"all_reduce": lambda: all_reduce(comm, buf, algorithm=ALGORITHM),
               "all_gather": lambda: all_gather(comm, part, sizes=[part.size] * p),
               "reduce_scatter": lambda: reduce_scatter(comm, buf[: part.size * p]),
               "p2p": lambda: comm.sendrecv(buf, peer, buf.copy(), peer, 12)
               if peer < p else None}
        for kind, fn in fns.items():
            comm.mpi.Barrier()
            t = comm.mpi.allreduce(_time_after(fn, work, gaps=gaps), op=MPI.MAX)
            key = f"{2 if kind == 'p2p' else p}:{placement}"
            out[kind].setdefault(key, []).append([n, t])
    return out
