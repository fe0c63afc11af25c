"""The α-β-γ cost model of collectives; ``auto`` picks by it.

A message of n bytes costs α + n·β, reducing n bytes n·γ (the constants:
``cost_params.py``, with β and γ by piece size).  For p ranks and S bytes:

    ring                2(p-1)·α + 2(p-1)/p·S·β + (p-1)/p·S·γ
    recursive doubling  log2 p'·(α + S·β + S·γ_shared)              (+ fold)
    rabenseifner        2·log2 p'·α + 2(p'-1)/p'·S·β + (p'-1)/p'·S·γ (+ fold)
    tree                2⌈log2 p⌉·(α + S·β) + ⌈log2 p⌉·S·γ
    hierarchical        ring RS(q) + ring AR(m, S/q) + ring AG(q)    (m nodes of q ranks)

with p' = 2^⌊log2 p⌋ and, when p' < p, the fold 2α + 2S·β + S·γ.  The all-to-all's two
algorithms have their own (``predict_all_to_all``: S is what each rank sends).  Pipelining a message
into k segments costs k·α instead of α.  Latency terms dominate small S (recursive
doubling wins), bandwidth terms large S (ring / Rabenseifner win).  Where the constants
know the link between nodes and the group spans several, ``predict`` prices each step by
the link it crosses instead (``two_level.py``).

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
``perf/calibrate_links.py`` holds the collectives that measure them
(``calibrate(comm)``, ``measure_winners``).

Why the model is here and its calibration in ``perf/``: every ``all_reduce``,
``broadcast`` and ``reduce`` called with ``algorithm="auto"`` (the default) decides by
``choose``, across nodes by the two-level model too, so the model is a layer of ``comm``
below the collectives (pure arithmetic on ``CostParams``: it sends nothing).  Measuring
the constants runs collectives (``measure_winners`` times each all-reduce), so it sits
above them, with the rest of the measuring, in ``perf/`` — which may import ``comm``,
never the other way round.
"""
from __future__ import annotations

import json
import math
import os

from minipar.comm import two_level
from minipar.comm.chunks import pow2_floor, segments
from minipar.comm.cost_params import DEFAULTS, CostParams, beta_of, gamma_of
from minipar.comm.exchange import SEGMENT_BYTES

FLAT = ("ring", "recursive_doubling", "rabenseifner", "tree")   # one kind of link
ALL_REDUCE_ALGORITHMS = FLAT + ("hierarchical",)


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


ALL_TO_ALL_ALGORITHMS = ("pairwise", "two_level")


def predict_all_to_all(algorithm, p, nbytes, c: CostParams, ranks_per_node=None,
                       seg=SEGMENT_BYTES):
    """Predicted seconds for an all-to-all in which every rank sends ``nbytes`` = S, S/p
    to each rank (itself included: a local copy).  With nodes of q ranks (m = p/q):

        pairwise   (p-1)·(α + S/p·β(S/p)) + S/p·γ(S/p)
        two_level  (q-1)·(α + m·S/p·β(m·S/p)) + (m-1)·(α + q·S/p·β(q·S/p)) + 2·S·γ(S)

    (a copy of n bytes priced n·γ(n): it streams them through memory once, as a
    reduction does; two_level packs every row before each of its two phases).  Two
    levels need m > 1 nodes of q > 1 ranks each; otherwise the collective runs, and this
    prices, the pairwise exchange.  Where ``c`` knows the link between nodes and the
    group spans several, each round is priced by the links it crosses
    (``two_level.predict_all_to_all``): there the pairwise exchange pays α_out in nearly
    every one of its p-1 rounds, two_level in its m-1 rounds across only.
    """
    if algorithm not in ALL_TO_ALL_ALGORITHMS:
        raise ValueError(f"no all-to-all cost model for {algorithm!r}")
    S = float(nbytes)
    if p <= 1 or S <= 0:
        return 0.0
    q = ranks_per_node or c.ranks_per_node
    if c.alpha_inter is not None and two_level.crosses_nodes(p, q):
        return two_level.predict_all_to_all(algorithm, p, S, c, q, seg)
    block = S / p
    if algorithm == "two_level" and q and 1 < q < p and p % q == 0:
        m = p // q
        return ((q - 1) * (c.alpha + m * block * beta_of(c, m * block))
                + (m - 1) * (c.alpha + q * block * beta_of(c, q * block))
                + 2 * S * gamma_of(c, S))
    return (p - 1) * (c.alpha + block * beta_of(c, block)) + block * gamma_of(c, block)


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
    communicates (calibrating is the explicit, collective
    ``perf/calibrate_links.calibrate``)."""
    c = comm.cache.get("cost")
    if c is None:
        c = comm.cache["cost"] = default_params()
    return c

