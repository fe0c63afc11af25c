"""The constants of the α-β-γ cost model, and what a byte costs at each piece size.

A message of n bytes costs α + n·β (α: latency incl. software overhead, β: seconds per
byte, 1/bandwidth); reducing n bytes costs n·γ.  ``CostParams`` holds them, plus the
link between nodes (α_inter, β_inter, its burst, the node size) for ``two_level.py``
and the measured winners for ``cost_model.choose``.

Why β and γ come in two sizes: one β from a 256 KiB exchange and one γ from an ``add``
on 64 KiB, both resident in cache, price an all-reduce of 1 MiB and more 2-4x low
(measured at p=2 on 2 cores).  A step of a large all-reduce moves and sums data that is
*not* in cache: the shared memory transport copies every byte twice through DRAM, and
the reduction streams its operands from DRAM too.  So β and γ depend on the size of the
piece a step handles:

    β(n) = β      if n <= cache_bytes      else β_large
    γ(n) = γ      if n <= cache_bytes      else γ_large

(``perf/calibrate_links.py`` measures both sides).  Recursive doubling sums into the very
buffer it has just sent: the partner's copy pulled those lines to its core, so that
reduction runs slower (γ_shared).  When ranks share cores with each other (or with other
work), a blocking wait costs a scheduler slice: the α measured then is the median over
rounds, not the best round, since a training step sees the typical wait.

Both models price with these two functions: the flat one (``cost_model.py``) and the
one over two kinds of links (``two_level.py``), which is why they live below both.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


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


# Measured with ``perf/calibrate_links.calibrate`` at np=2 on the 2-core development machine
# (loaded by other work, medians): α 30 µs, β 2.3 GB/s in cache / 1.0 GB/s beyond 1 MiB,
# γ 25 / 3 GB/s.
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
