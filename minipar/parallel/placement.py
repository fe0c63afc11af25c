"""Ownership, written once: where every parameter lives on the grid.

Every parameter has a global name (``blocks.0.mlp.fc.weight``), a global shape (the
plain GPT's) and a *placement*, the chain of cuts from the global tensor to what one
rank holds and updates (PyTorch DTensor's Shard(dim) / Replicate with DCP's chunks,
Megatron's ShardedTensor with its ``flattened_range``):

    global tensor (shape)
      ── tp:    Shard(axis, groups) over the tp group, or replicated   -> the tp piece
      ── pp:    held by one virtual pipeline stage (or by all without a pipeline)
      ── dp:    ``owned``, a SlotRange made by the gradient synchroniser: elements
                [lo, hi) of the flattened tp piece, which the optimizer updates as
                elements [start, start + hi - lo) of its slot ``slot``; the whole piece
                (DDP) or this rank's range of a flat bucket (ZeRO-1/2/3)

    local = placement.local(full)  =  flatten(Shard.local(full))[lo:hi]   (ZeRO-3)
                                   =  Shard.local(full)                   (otherwise)

and its *replication*: how many ranks hold the same values, and which one of them
counts them (writes them to a checkpoint):

    over tp:  every tp rank for a replicated weight, ``Shard.replicas`` for a part held
              by several (a KV head copied for grouped-query attention); the first counts
    over dp:  every data-parallel rank under DDP, one under ZeRO; dp rank 0 counts

Every consumer reads this one record: construction (draw a tensor, keep
``local(full)``), the global norm's weights (1 / tp replicas) and the sequence-parallel
partial sums, the checkpoint's index and resharding (``checkpoint/shards.py``) and
the memory a rank holds (``local_size``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from minipar.parallel.tensor.sharding import Shard


@dataclass(frozen=True)
class SlotRange:
    """The data-parallel cut: where a parameter's elements sit in the optimizer's slots."""
    slot: int                 # index of the slot (a bucket, or this rank's shard of one)
    lo: int                   # elements [lo, hi) of the flattened tp piece ...
    hi: int
    start: int                # ... are elements [start, start + hi - lo) of the slot
    dp_replicas: int = 1      # data-parallel ranks whose slots hold these same elements
    dp_first: bool = True     # this rank is the first of them (the one that counts them)
    weights_sharded: bool = False   # the model's weights too are only [lo, hi) (ZeRO-3)


@dataclass(frozen=True)
class Placement:
    name: str
    shape: tuple                      # global shape
    tp: Optional[Shard] = None        # split over the tp group; None: replicated over tp
    tp_rank: int = 0
    tp_size: int = 1
    stage: Optional[int] = None       # virtual pipeline stage holding it; None: no pipeline
    owned: Optional[SlotRange] = None   # the synchroniser's cut (None: not made yet)
    sequence_parallel: bool = False   # activations split over tp along the sequence

    @property
    def tp_replicas(self):
        """tp ranks holding the same values as this one."""
        return self.tp_size if self.tp is None else self.tp.replicas

    @property
    def norm_weight(self):
        """w in ||g||² = Σ w·g² summed over the tp group: each element counted once."""
        return 1.0 / self.tp_replicas

    @property
    def tp_partial_grad(self):
        """Whether this rank's gradient is only its part of a sum over tp: a weight
        replicated over tp sees only this rank's tokens under sequence parallelism."""
        return self.sequence_parallel and self.tp_size > 1 and self.tp is None

    @property
    def counted_here(self):
        """Whether this rank is the one that counts (writes) its values: the first holder
        over tp and over dp."""
        first_over_tp = self.tp_rank % self.tp_replicas == 0
        return first_over_tp and (self.owned is None or self.owned.dp_first)

    @property
    def piece_shape(self):
        """The shape of the tp piece (the global shape when replicated over tp)."""
        if self.tp is None:
            return tuple(self.shape)
        return self.tp.piece_shape(self.shape, self.tp_rank, self.tp_size)

    @property
    def local_size(self):
        """Elements this rank holds."""
        if self.owned is not None and self.owned.weights_sharded:
            return self.owned.hi - self.owned.lo
        return math.prod(self.piece_shape)

    def boxes(self):
        """The tp piece as boxes of the global tensor, [(offsets, lengths)], in the
        order the piece lays them out: one box, or one per group (qkv's q, k and v
        columns of my heads).  What a checkpoint's index records for each chunk."""
        if self.tp is None:
            return [((0,) * len(self.shape), tuple(self.shape))]
        axis, groups = self.tp.axis, self.tp.groups
        lo, hi = self.tp.part(self.shape, self.tp_rank, self.tp_size)
        block = self.shape[axis] // groups
        out = []
        for g in range(groups):
            offsets = [0] * len(self.shape)
            lengths = list(self.shape)
            offsets[axis], lengths[axis] = g * block + lo, hi - lo
            out.append((tuple(offsets), tuple(lengths)))
        return out

    def to_global(self, box):
        """A box of the tp piece as [(that part of the box, the same elements as a box of
        the global tensor)]: one pair, or one per group the box crosses (qkv's q, k and v
        columns sit side by side in the piece, a block apart in the global tensor)."""
        if self.tp is None:
            return [(box, box)]
        axis, (offsets, lengths) = self.tp.axis, box
        lo, hi = self.tp.part(self.shape, self.tp_rank, self.tp_size)
        width, block = hi - lo, self.shape[axis] // self.tp.groups
        out = []
        for g in range(self.tp.groups):       # group g: piece columns [g·width, (g+1)·width)
            a = max(offsets[axis], g * width)
            b = min(offsets[axis] + lengths[axis], (g + 1) * width)
            if a < b:
                part = (_put(offsets, axis, a), _put(lengths, axis, b - a))
                out.append((part, (_put(offsets, axis, g * block + lo + a - g * width), part[1])))
        return out

    def piece(self, full):
        """The tp piece of the full array (a contiguous host copy, or ``full`` itself)."""
        if self.tp is None:
            return full
        return self.tp.local(full, self.tp_rank, self.tp_size, module=np)

    def local(self, full):
        """What this rank holds of the full array: the tp piece, then the ZeRO-3 range."""
        part = self.piece(full)
        if self.owned is None or not self.owned.weights_sharded:
            return part
        return part.reshape(-1)[self.owned.lo:self.owned.hi]


def _put(values, axis, value):
    return tuple(value if i == axis else v for i, v in enumerate(values))


def tp_placements(global_shapes, tp_model=None, tp_comm=None, sequence_parallel=False,
                  module=None):
    """The cuts made before the synchroniser: tp (from ``tp_model.shard_specs``) and, where
    ``module`` is a pipeline rank's ``RankStages``, the stage.  What construction needs to
    cut a freshly drawn tensor to this rank's piece; the synchroniser adds its own cut."""
    specs = getattr(tp_model, "shard_specs", {}) if tp_model is not None else {}
    rank, size = (tp_comm.rank, tp_comm.size) if tp_model is not None else (0, 1)
    stage_of = {}
    for stage in getattr(module, "stages", []):
        for name, _ in stage.named_parameters():
            stage_of[name] = stage.index
    return {n: Placement(n, tuple(s), specs.get(n), rank, size, stage_of.get(n),
                         sequence_parallel=sequence_parallel)
            for n, s in global_shapes.items()}


def slot_segments(table, slots):
    """Per slot: [(name, lo, hi, start)] of the parameters whose elements it holds,
    read from the placements (``SlotRange``)."""
    out = [[] for _ in range(slots)]
    for name, p in table.items():
        if p.owned is not None and p.owned.lo < p.owned.hi:
            out[p.owned.slot].append((name, p.owned.lo, p.owned.hi, p.owned.start))
    return out
