"""The α-β-γ cost model of collectives; ``auto`` picks by it.

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

Why the first version was 2-4x low from 1 MiB up (measured at p=2 on 2 cores): it took
β from one 256 KiB exchange and γ from an ``add`` on 64 KiB, both resident in cache.
A step of a large all-reduce moves and sums data that is *not* in cache: the shared
memory transport copies every byte twice through DRAM, and the reduction streams its
operands from DRAM too.  So β and γ depend on the size of the piece a step handles:

    β(n) = β      if n <= cache_bytes      else β_large
    γ(n) = γ      if n <= cache_bytes      else γ_large

(``calibrate`` measures both sides).  Recursive doubling sums into the very buffer it
has just sent: the partner's copy pulled those lines to its core, so that reduction
runs slower (γ_shared).  When ranks share cores with each other (or with other work),
a blocking wait costs a scheduler slice: the α measured then is the median over
rounds, not the best round, since a training step sees the typical wait.

``auto`` follows measured winners where a calibration recorded them (``winners``:
the fastest algorithm at each measured size, for this group size); between and beyond
those sizes it takes the model's choice.

Calibration is explicit and visible (issue 18): ``params(comm)`` never communicates;
it returns, in this order, what ``use(comm, c)`` set, ``MINIPAR_COMM_ALPHA/BETA/GAMMA``
from the environment, a profile named by ``MINIPAR_COMM_PROFILE`` (a JSON file with
the fields of ``CostParams``, as ``minipar calibrate`` writes under ``"cost_params"``),
or ``DEFAULTS`` (measured on a 2-core machine, np=2, MPICH shared memory).
``calibrate(comm)`` is the collective that measures them.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace


from minipar.backend import xp
from minipar.comm import two_level
from minipar.comm.chunks import pow2_floor, segments
from minipar.comm.exchange import SEGMENT_BYTES, exchange, exchange_reduce

ALL_REDUCE_ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "tree", "hierarchical")


@dataclass(frozen=True)
class CostParams:
    alpha: float = 5e-6     # s per message
    beta: float = 2e-10     # s per byte moved    (5 GB/s), pieces in cache
    gamma: float = 2e-10    # s per byte reduced  (5 GB/s), pieces in cache
    # s per byte reduced into a buffer the partner has just read (recursive doubling sends
    # the very buffer it then sums into); None: the same as gamma
    gamma_shared: float | None = None
    beta_large: float | None = None     # s per byte moved, pieces beyond cache_bytes
    gamma_large: float | None = None    # s per byte reduced, pieces beyond cache_bytes
    cache_bytes: float | None = None    # None: one β and one γ at every size
    winners: tuple = ()                 # ((nbytes, algorithm), ...) measured at this p
    winners_p: int = 0                  # the group size the winners were measured at
    # the link between nodes (two_level.py): its α and β, and the node size (ranks 0..q-1
    # on node 0, ...) they were measured with; None / 0: one kind of link everywhere
    alpha_inter: float | None = None
    beta_inter: float | None = None
    ranks_per_node: int = 0

    def to_dict(self):
        d = asdict(self)
        d["winners"] = [list(w) for w in self.winners]
        return d

    @classmethod
    def from_dict(cls, d):
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["winners"] = tuple(tuple(w) for w in known.get("winners", ()))
        return cls(**known)


# Measured with ``calibrate`` at np=2 on the 2-core development machine (loaded by other
# work, medians): α 30 µs, β 2.3 GB/s in cache / 1.0 GB/s beyond 1 MiB, γ 25 / 3 GB/s.
DEFAULTS = CostParams(alpha=3e-5, beta=4.3e-10, gamma=4e-11, gamma_shared=1.9e-10,
                      beta_large=1e-9, gamma_large=3.3e-10, cache_bytes=float(1 << 20))


def _big(c, n):
    return c.cache_bytes is not None and n > c.cache_bytes


def beta_of(c, n):
    """Seconds per byte for a piece of ``n`` bytes."""
    return c.beta_large if (_big(c, n) and c.beta_large) else c.beta


def gamma_of(c, n, shared=False):
    """Seconds per byte reduced for a piece of ``n`` bytes."""
    if _big(c, n) and c.gamma_large:
        return max(c.gamma_large, (c.gamma_shared or 0) if shared else 0)
    return (c.gamma_shared or c.gamma) if shared else c.gamma


def _ring(p, S, c, seg=SEGMENT_BYTES):
    if p == 1:
        return 0.0
    k = segments(S / p, seg)
    piece = S / p
    return ((p - 1) * (k + 1) * c.alpha + 2 * (p - 1) / p * S * beta_of(c, piece)
            + (p - 1) / p * S * gamma_of(c, piece))


def _fold(p, S, c):
    if pow2_floor(p) == p:
        return 0.0
    return 2 * c.alpha + 2 * S * beta_of(c, S) + S * gamma_of(c, S)


def predict(algorithm, p, nbytes, c: CostParams, ranks_per_node=None, seg=SEGMENT_BYTES):
    """Predicted seconds for an all-reduce of ``nbytes`` over ``p`` ranks.  Where ``c``
    knows the link between nodes and the group spans several, the two-level model."""
    S = float(nbytes)
    if p == 1:
        return 0.0
    q = ranks_per_node or c.ranks_per_node
    if c.alpha_inter is not None and two_level.crosses_nodes(p, q):
        return two_level.predict(algorithm, p, S, c, q, seg)
    p2 = pow2_floor(p)
    L = int(math.log2(p2))
    if algorithm == "ring":
        return _ring(p, S, c, seg)
    if algorithm == "recursive_doubling":
        g = gamma_of(c, S, shared=True)
        return L * (segments(S, seg) * c.alpha + S * beta_of(c, S) + S * g) + _fold(p, S, c)
    if algorithm == "rabenseifner":
        b, g = beta_of(c, S / 2), gamma_of(c, S / 2)
        return (L * c.alpha + sum(segments(S / 2 ** (i + 1), seg) * c.alpha for i in range(L))
                + 2 * (p2 - 1) / p2 * S * b + (p2 - 1) / p2 * S * g + _fold(p, S, c))
    if algorithm == "tree":
        d = math.ceil(math.log2(p))
        return 2 * d * (c.alpha + S * beta_of(c, S)) + d * S * gamma_of(c, S)
    if algorithm == "hierarchical":
        q = min(ranks_per_node or p, p)
        m = math.ceil(p / q)
        ag = (q - 1) * c.alpha + (q - 1) / q * S * beta_of(c, S / q) if q > 1 else 0.0
        rs = _ring(q, S, c, seg) - ag if q > 1 else 0.0
        return rs + _ring(m, S / q, c, seg) + ag
    raise ValueError(f"no cost model for {algorithm!r}")


def predict_broadcast(algorithm, p, nbytes, c: CostParams):
    d = math.ceil(math.log2(p)) if p > 1 else 0
    if algorithm == "binomial":
        return d * (c.alpha + nbytes * beta_of(c, nbytes))
    return (d + p - 1) * c.alpha + 2 * (p - 1) / p * nbytes * beta_of(c, nbytes / p)


def _measured_winner(p, nbytes, c, candidates):
    """The winner measured at the nearest size (log scale), if it was measured at this
    p, lies within a factor 2 of ``nbytes`` and is a candidate."""
    if not c.winners or c.winners_p != p or nbytes <= 0:
        return None
    size, name = min(c.winners, key=lambda w: abs(math.log2(max(w[0], 1) / nbytes)))
    if abs(math.log2(max(size, 1) / nbytes)) <= 1.0 and name in candidates:
        return name
    return None


def choose(p, nbytes, c: CostParams, candidates=("ring", "recursive_doubling",
                                                 "rabenseifner", "tree"), ranks_per_node=None):
    """The measured winner near this size, else the candidate with the smallest
    predicted time (ties: first listed)."""
    return (_measured_winner(p, nbytes, c, candidates)
            or min(candidates, key=lambda a: predict(a, p, nbytes, c, ranks_per_node)))


# ---------------------------------------------------------------- explicit constants
def use(comm, c: CostParams):
    """Make ``c`` the constants of ``comm`` (forgets choices made with other ones)."""
    for key in [k for k in comm.cache if isinstance(k, tuple) and k and k[0] == "auto"]:
        del comm.cache[key]
    comm.cache["cost"] = c
    return c


def default_params() -> CostParams:
    """The constants used without calibration: environment, profile file, DEFAULTS."""
    env = [os.environ.get(f"MINIPAR_COMM_{k}") for k in ("ALPHA", "BETA", "GAMMA")]
    if all(env):
        return CostParams(*map(float, env))
    path = os.environ.get("MINIPAR_COMM_PROFILE")
    if path:
        with open(path) as f:
            data = json.load(f)
        return CostParams.from_dict(data.get("cost_params", data))
    return DEFAULTS


def params(comm) -> CostParams:
    """The constants of ``comm``: what ``use`` set, else ``default_params()``.  Never
    communicates (calibrating is the explicit, collective ``calibrate``)."""
    c = comm.cache.get("cost")
    if c is None:
        c = comm.cache["cost"] = default_params()
    return c




# ---------------------------------------------------------------- calibration (collective)
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
    c = two_level.calibrate_across(comm, c)   # on several nodes: the link between them too
    for k, v in saved.items():
        setattr(comm.counters, k, v)
    return c


def measure_winners(comm, sizes, c: CostParams | None = None, reps=7,
                    algorithms=("ring", "recursive_doubling", "rabenseifner", "tree")):
    """Collective: time each algorithm's all-reduce at each size (taking turns, median
    of the slowest rank) and return ``c`` with the fastest at each size as ``winners``
    (what ``choose`` follows), plus the raw table {size: {algorithm: seconds}}."""
    from mpi4py import MPI
    from minipar.comm.collectives import all_reduce
    c = c or params(comm)
    saved = comm.counters.as_dict()
    table = {}
    for n in sizes:
        buf = xp.ones(max(n // 4, 1), dtype=xp.float32)
        times = xp.zeros((len(algorithms), reps), dtype=xp.float64)
        for r in range(-1, reps):
            for k, alg in enumerate(algorithms):
                buf.fill(1)
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
    return replace(c, winners=winners, winners_p=comm.size), table
