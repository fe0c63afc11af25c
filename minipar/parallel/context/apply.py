"""Context parallelism applied to a model: the ring, or Ulysses (and the hybrid)."""
from __future__ import annotations

from minipar.parallel.context.ring import apply_ring
from minipar.parallel.context.ulysses import apply_ulysses


def apply_context_parallel(model, cp_comm, zigzag=True, kind="ring", ulysses=None):
    """Make ``model`` (plain or tensor-parallel GPT) hold this rank's positions of every
    sequence, its attention cores swapped: ring attention (``kind`` "ring", ``ring.py``),
    or Ulysses over groups of ``ulysses`` cp ranks (default: all of them) with the ring
    across the groups (``kind`` "ulysses", ``ulysses.py``)."""
    if kind == "ring":
        return apply_ring(model, cp_comm, zigzag)
    if kind == "ulysses":
        return apply_ulysses(model, cp_comm, ulysses or cp_comm.size, zigzag)
    raise ValueError(f"unknown context-parallel kind {kind!r}; choose ring or ulysses")
