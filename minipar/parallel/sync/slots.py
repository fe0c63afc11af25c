"""What a synchroniser hands the optimizer step: Slots.

A ``Slot`` is one array this rank updates: a flat bucket (DDP) or this rank's shard of
one (ZeRO).  Besides the master and its gradient it carries, per element where a bucket
mixes parameters, the facts the step needs about them, read from the parameters'
placements (``parallel/placement.py``; ``GradSync.slot_facts``):

    decay          1 where weight decay applies (matrices), 0 on biases and norms
                   (the optimizer step scales a per-element mask to λ·mask in place)
    norm_weight    w in ||g||² = Σ w·g²: 1/tp for a weight replicated on the tp ranks,
                   so that summing over the tp group counts it once
    tp_replicated  True where the gradient is only this rank's part of a sum over tp
                   (replicated weights under sequence parallelism)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipar.backend import xp
from minipar.comm import broadcast
from minipar.nn.init import is_placeholder
from minipar.parallel.buckets import make_buckets


@dataclass
class Slot:
    master: Any                  # updated in place by the optimizer step
    grad: Any = None             # set by ``finish``: averaged over dp, master dtype
    decay: Any = 1.0
    norm_weight: Any = 1.0
    tp_replicated: Any = False
    decay_scale: Any = None      # the weight decay a per-element mask was scaled by (step.py)


def value_source(names, initial_piece):
    """param -> its values: its own array, or for a placeholder (``nn/init.py``: not drawn
    yet) ``initial_piece(name)``, this rank's piece drawn from (seed, name).  Synchronisers
    that pack weights into flat buffers draw them straight there: no second copy."""
    def value_of(p):
        if not is_placeholder(p.data):
            return p.data
        if initial_piece is None:
            raise ValueError(f"{names[id(p)]} has no values yet and no initial_piece was "
                             "given to draw them")
        return initial_piece(names[id(p)])
    return value_of


def bucket_mask(bucket, names, value_of, dtype, lo=0, hi=None):
    """Elements [lo, hi) (default: all) of a flat per-element array over ``bucket``:
    value_of(name, param) on each parameter.  Only the range is allocated."""
    hi = bucket.padded if hi is None else hi
    mask = xp.zeros(hi - lo, dtype=dtype)
    for p, start, stop in bucket.ranges(lo, hi):
        mask[start - lo:stop - lo] = value_of(names[id(p)], p)
    return mask


def broadcast_parameters(params, comm, root=0):
    """Make every replica start from root's weights (one flat broadcast per dtype)."""
    if comm.size == 1:
        return
    for bucket in make_buckets(params, bucket_bytes=float("inf")):
        flat = bucket.pack_data()
        broadcast(comm, flat, root=root)
        for p, view in bucket.views(flat):
            p.data[...] = view
