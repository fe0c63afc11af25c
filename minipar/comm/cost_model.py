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

Why β and γ come in two sizes: one β from a 256 KiB exchange and one γ from an ``add``
on 64 KiB, both resident in cache, price an all-reduce of 1 MiB and more 2-4x low
(measured at p=2 on 2 cores).  A step of a large all-reduce moves and sums data that is
*not* in cache: the shared memory transport copies every byte twice through DRAM, and
the reduction streams its operands from DRAM too.  So β and γ depend on the size of the
piece a step handles:

    β(n) = β      if n <= cache_bytes      else β_large
    γ(n) = γ      if n <= cache_bytes      else γ_large

(``calibrate`` measures both sides).  Recursive doubling sums into the very buffer it
has just sent: the partner's copy pulled those lines to its core, so that reduction
runs slower (γ_shared).  When ranks share cores with each other (or with other work),
a blocking wait costs a scheduler slice: the α measured then is the median over
rounds, not the best round, since a training step sees the typical wait.

``auto`` follows measured winners where a calibration recorded them (``winners``:
the fastest algorithm at each measured size, for this group size); between and beyond
those sizes it takes the model's choice.  A winner decides only among the algorithms
it was timed against (``winners_among``): a profile whose calibration timed the flat
ones only still lets the model pick the hierarchical all-reduce across nodes.

Calibration is explicit and visible: ``params(comm)`` never communicates;
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
from dataclasses import asdict, dataclass


from minipar.comm import two_level
from minipar.comm.chunks import pow2_floor, segments
from minipar.comm.exchange import SEGMENT_BYTES

FLAT = ("ring", "recursive_doubling", "rabenseifner", "tree")   # one kind of link
ALL_REDUCE_ALGORITHMS = FLAT + ("hierarchical",)


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
    winners_among: tuple = ()           # the algorithms timed for them; () : the four flat ones
    # the link between nodes (two_level.py): its α and β, and the node size (ranks 0..q-1
    # on node 0, ...) they were measured with; None / 0: one kind of link everywhere
    alpha_inter: float | None = None
    beta_inter: float | None = None
    ranks_per_node: int = 0
    burst_inter: float = 0.0            # bytes a shaped link passes at once after idling

    def to_dict(self):
        d = asdict(self)
        d["winners"] = [list(w) for w in self.winners]
        d["winners_among"] = list(self.winners_among)
        return d

    @classmethod
    def from_dict(cls, d):
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["winners"] = tuple(tuple(w) for w in known.get("winners", ()))
        known["winners_among"] = tuple(known.get("winners_among", ()))
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


def _fold_seconds(p, S, c):
    """The fold onto a power of two (``doubling._fold_in``/``_fold_out``; as steps,
    ``two_level._fold_steps``): 2α + 2S·β + S·γ, nothing when p is a power of two."""
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
        return L * (segments(S, seg) * c.alpha + S * beta_of(c, S) + S * g) + _fold_seconds(p, S, c)
    if algorithm == "rabenseifner":
        b, g = beta_of(c, S / 2), gamma_of(c, S / 2)
        return (L * c.alpha + sum(segments(S / 2 ** (i + 1), seg) * c.alpha for i in range(L))
                + 2 * (p2 - 1) / p2 * S * b + (p2 - 1) / p2 * S * g + _fold_seconds(p, S, c))
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


def hierarchical_applies(c: CostParams, p):
    """Whether the hierarchical all-reduce is worth timing and choosing for ``p`` ranks
    under ``c``: it knows the link between nodes, and the group spans several nodes of
    more than one rank (with one rank a node it is its own inner algorithm)."""
    return c.alpha_inter is not None and 1 < c.ranks_per_node < p


def choose(p, nbytes, c: CostParams, candidates=FLAT, ranks_per_node=None):
    """The measured winner near this size, else the candidate with the smallest
    predicted time (ties: first listed).  A winner decides only among the algorithms it
    was timed against: a candidate that was not (hierarchical, where a calibration
    measured the flat ones only) competes with it by the model."""
    def model(a):
        return predict(a, p, nbytes, c, ranks_per_node)
    winner = _measured_winner(p, nbytes, c, candidates)
    if winner is None:
        return min(candidates, key=model)
    untimed = [a for a in candidates if a not in (c.winners_among or FLAT)]
    return min([winner, *untimed], key=model)


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


# measuring the constants is its own module; its entry points keep their names here
from minipar.comm.calibrate_links import calibrate, measure_winners  # noqa: E402,F401
