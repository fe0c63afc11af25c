"""Measuring the cost model's constants: an explicit collective, never a hidden one.

``calibrate(comm)`` times, through the minipar transport, what ``comm/cost_model.py``
prices: α (one step of a collective on a few bytes), β and β_large (an exchange in and
beyond cache), γ, γ_large and γ_shared (reductions) between ranks 0 and 1 — and, where
MPI sees the ranks on several nodes, α, β and the burst of the link between them
(``calibrate_across``, for ``comm/two_level.py``).  Every rank gets the same numbers.
``measure_winners`` times each all-reduce algorithm at a few sizes; ``auto`` then
follows the measured winner.  Neither installs anything: ``cost_model.use(comm, c)`` does,
or a profile's ``cost_params`` (``minipar calibrate``, ``perf/calibrate.py``).

Why here and not in ``comm/``: measuring runs the collectives it measures
(``measure_winners`` calls ``all_reduce``), so it sits above them, with the rest of
minipar's measuring; the model it feeds stays in ``comm/``, whose ``auto`` decides by it.

While two ranks measure, the others wait asleep (``wait_idle``): on a machine whose cores
the ranks share, spinning bystanders take the cores the measurement needs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import replace

import numpy  # host metadata (node numbers, the broadcast constants) only

from mpi4py import MPI

from minipar.backend import xp
from minipar.comm import all_reduce, two_level
from minipar.comm.cost_model import FLAT, hierarchical_applies, params
from minipar.comm.cost_params import DEFAULTS, CostParams
from minipar.comm.exchange import exchange, exchange_reduce


def wait_idle(comm, poll_s=1e-3):
    """A barrier whose waiting ranks sleep instead of spinning: while two ranks measure,
    the others must not take the cores (on 2 cores, two spinning bystanders halved the
    bandwidth measured across a simulated cluster's link)."""
    request = comm.mpi.Ibarrier()
    while not request.Test():
        time.sleep(poll_s)


def _median_time(fn, reps, before=None):
    times = []
    for i in range(-3, reps):     # 3 untimed rounds first: connection setup, page faults
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        if i >= 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _pair_constants(comm, peer, small, mid, large, reps):
    """(α, β, γ, γ_shared, β_large, γ_large) measured between ranks 0 and 1."""
    line_up = lambda: comm.sendrecv(a[:0], peer, a[:0], peer, 11)  # noqa: E731
    a = xp.zeros(max(small // 4, 1), dtype=xp.float32)
    alpha = _median_time(lambda: exchange_reduce(comm, a, peer, a, peer, xp.add, tag=11),
                         reps, line_up)

    def moved(n):            # seconds per byte of one simultaneous exchange of n bytes
        send, recv = xp.ones(n, dtype=xp.uint8), xp.zeros(n, dtype=xp.uint8)
        t = _median_time(lambda: exchange(comm, send, peer, recv, peer, tag=11),
                         max(3, reps // 2), lambda: (send.fill(1), line_up()))
        return max((t - alpha) / n, 1e-12)

    def reduced(n):          # seconds per byte of x += y on n fresh bytes
        x, y = xp.ones(n // 4, dtype=xp.float32), xp.ones(n // 4, dtype=xp.float32)
        return max(_median_time(lambda: xp.add(x, y, out=x), reps, lambda: x.fill(1)) / n,
                   1e-13)

    beta, beta_large = moved(mid * 4), moved(large)
    gamma, gamma_large = reduced(mid), reduced(large)
    return alpha, beta, gamma, _gamma(comm, peer, mid) / mid, beta_large, gamma_large


def _gamma(comm, peer, nbytes, reps=15):
    """Seconds to reduce ``nbytes`` inside an exchange step: median exchange_reduce of a
    buffer with itself (send is recv, as in recursive doubling) minus median plain
    exchange, both from a freshly written buffer.  On 2 cores this measures ~4 GB/s
    where an ``add`` on cached data runs at ~25 GB/s: the partner has just read the
    buffer, so writing the sum first takes every cache line back from its core."""
    b = xp.ones(nbytes // 4, dtype=xp.float32)
    tmp = xp.empty_like(b)
    times = [[], []]
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
                times[k].append(time.perf_counter() - t0)
    return max(statistics.median(times[0]) - statistics.median(times[1]), 1e-12 * nbytes)


def calibrate(comm, small=8, mid=64 << 10, large=8 << 20, reps=20,
              cache_bytes=1 << 20) -> CostParams:
    """Collective: measure the constants between ranks 0 and 1, through the minipar
    transport (so Python's overhead is in them), and give every rank the same values.
    Medians over rounds, not minima: on shared cores a step sees the typical wait.

    - α: one step of a collective on ``small`` bytes (send, receive, reduce);
    - β: one simultaneous exchange of 4·``mid`` bytes (in cache), minus α;
      β_large: the same for ``large`` bytes (beyond ``cache_bytes``: through DRAM);
    - γ: ``x += y`` on ``mid`` bytes of cached data; γ_large: on ``large`` bytes;
    - γ_shared: reducing into the buffer the partner has just read (recursive doubling);
    - on ranks spread over nodes, α and β between them (``two_level.calibrate_across``).

    It does not install them: ``use(comm, calibrate(comm))`` does.
    """
    saved = comm.counters.as_dict()
    vals = xp.zeros(6, dtype=xp.float64)
    if comm.size > 1 and comm.rank < 2:
        vals[:] = _pair_constants(comm, 1 - comm.rank, small, mid, large, reps)
    wait_idle(comm)
    if comm.size == 1:
        d = DEFAULTS
        vals[:] = d.alpha, d.beta, d.gamma, d.gamma_shared, d.beta_large, d.gamma_large
    host = vals if not hasattr(vals, "get") else vals.get()
    comm.mpi.Bcast(host, root=0)  # setup only: every rank must hold identical constants
    a, b, g, gs, bl, gl = (float(v) for v in host)
    c = CostParams(a, b, g, gs, beta_large=bl, gamma_large=gl, cache_bytes=float(cache_bytes))
    c = calibrate_across(comm, c)   # on several nodes: the link between them too
    for k, v in saved.items():
        setattr(comm.counters, k, v)
    return c


def measure_winners(comm, sizes, c: CostParams | None = None, reps=7, algorithms=None):
    """Collective: time each algorithm's all-reduce at each size (taking turns, median
    of the slowest rank) and return ``c`` with the fastest at each size as ``winners``
    (what ``choose`` follows; ``winners_among`` the algorithms timed), plus the raw
    table {size: {algorithm: seconds}}.  By default the four flat algorithms, and the
    hierarchical one where ``c`` knows the link between nodes and the group spans them."""
    c = c or params(comm)
    if algorithms is None:
        algorithms = FLAT + (("hierarchical",) if hierarchical_applies(c, comm.size) else ())
    saved = comm.counters.as_dict()
    idle_s = two_level.refill_seconds(c)       # each call on an idle link, as bench comm
    table = {}
    for n in sizes:
        buf = xp.ones(max(n // 4, 1), dtype=xp.float32)
        times = xp.zeros((len(algorithms), reps), dtype=xp.float64)
        for r in range(-1, reps):
            for k, alg in enumerate(algorithms):
                buf.fill(1)
                if idle_s:
                    time.sleep(idle_s)
                comm.mpi.Barrier()
                t0 = time.perf_counter()
                all_reduce(comm, buf, "sum", alg)
                if r >= 0:
                    times[k, r] = time.perf_counter() - t0
        host = times if not hasattr(times, "get") else times.get()
        comm.mpi.Allreduce(MPI.IN_PLACE, host, op=MPI.MAX)
        table[n] = {alg: float(statistics.median(row)) for alg, row in zip(algorithms, host)}
    for k, v in saved.items():
        setattr(comm.counters, k, v)
    winners = tuple((n, min(t, key=t.get)) for n, t in table.items())
    return replace(c, winners=winners, winners_p=comm.size, winners_among=tuple(algorithms)), table


def node_size(comm):
    """Collective: q if the ranks of ``comm`` sit on nodes of q consecutive ranks (MPI's
    shared-memory split: the launcher's hosts), else 0 (one node, or another placement)."""
    node = comm.mpi.Split_type(MPI.COMM_TYPE_SHARED, comm.rank)
    q, first = node.Get_size(), node.allreduce(comm.rank, op=MPI.MIN)
    node.Free()
    placed = numpy.array(comm.mpi.allgather((q, first)))
    block = all(qq == q and f == (r // q) * q for r, (qq, f) in enumerate(placed.tolist()))
    return q if block and q < comm.size else 0


def calibrate_across(comm, c, small=8, large=8 << 20, probe=2 << 20, idle_s=0.02, reps=7):
    """Collective: ``c`` with α and β of the link between nodes, measured between rank 0
    and rank q (the first rank of the next node) through the minipar transport — α one
    exchange of ``small`` bytes, β one of ``large`` bytes minus α, medians, back to back —
    its burst, and the node size q.  On one node ``c`` unchanged.

    The burst B: a shaped link (a token bucket) passes B bytes at once after idling, so
    an exchange of n >= B bytes after ``idle_s`` asleep takes t(n) = α + (n - B)·β, and
    one size P gives B = P - (t(P) - α) / β (P = ``probe``; below 5% of P it is timing
    noise: 0).  β is the back-to-back rate above, timed over 8 MiB and many calls: a rate
    from the difference of two probe sizes (as this did before) put B anywhere from 450 to
    760 kB for tbf's 478 kB of payload, since a 1 ms error in one probe moves it 120 kB."""
    q = node_size(comm)
    if not q:
        return c
    peer = {0: q, q: 0}.get(comm.rank)
    vals = numpy.zeros(3)
    if peer is not None:
        tiny = xp.zeros(max(small // 4, 1), dtype=xp.float32)
        line_up = lambda: comm.sendrecv(tiny[:0], peer, tiny[:0], peer, 11)  # noqa: E731
        got = xp.empty_like(tiny)
        alpha = _median_time(lambda: exchange(comm, tiny, peer, got, peer, tag=11), reps, line_up)
        send, recv = xp.ones(large, dtype=xp.uint8), xp.zeros(large, dtype=xp.uint8)
        t = _median_time(lambda: exchange(comm, send, peer, recv, peer, tag=11), reps, line_up)
        beta = max((t - alpha) / large, 1e-12)

        def idle_then_line_up():
            time.sleep(idle_s)
            line_up()
        t1 = _median_time(lambda: exchange(comm, send[:probe], peer, recv[:probe], peer, tag=11),
                          reps, idle_then_line_up)
        burst = min(max(probe - (t1 - alpha) / beta, 0.0), probe)
        vals[:] = alpha, beta, burst if burst >= 0.05 * probe else 0.0
    wait_idle(comm)
    comm.mpi.Bcast(vals, root=0)
    return replace(c, alpha_inter=float(vals[0]), beta_inter=float(vals[1]),
                   burst_inter=float(vals[2]), ranks_per_node=q)
