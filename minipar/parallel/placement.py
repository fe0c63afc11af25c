"""Ownership, written once: where every parameter lives on the grid.

Every parameter has a global name (``blocks.0.mlp.fc.weight``), a global shape (the
plain GPT's) and a *placement*, the chain of cuts from the global tensor to what one
rank holds (PyTorch DTensor's Shard(dim) / Replicate, Megatron's ShardedTensor):

    global tensor (shape)
      ── tp:    Shard(axis, groups) over the tp group, or replicated   -> the tp piece
      ── pp:    held by one virtual pipeline stage (or by all without a pipeline)
      ── ZeRO-3: elements [lo, hi) of the flattened tp piece, this rank's range of the
                 unit's flat bucket (or the whole piece without ZeRO-3) -> the local part

    local = placement.local(full)  =  flatten(Shard.local(full))[lo:hi]   (ZeRO-3)
                                   =  Shard.local(full)                   (otherwise)

The same table drives construction (draw a tensor, keep ``local(full)``, drop the rest:
one full tensor on the host at a time), the memory a rank holds (``local_size``) and —
for the checkpoint's index — which global elements each rank's bytes are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from minipar.parallel.tensor.sharding import Shard


@dataclass(frozen=True)
class Placement:
    name: str
    shape: tuple                      # global shape
    tp: Optional[Shard] = None        # split over the tp group; None: replicated over tp
    tp_rank: int = 0
    tp_size: int = 1
    stage: Optional[int] = None       # virtual pipeline stage holding it; None: no pipeline
    flat: Optional[tuple] = None      # ZeRO-3: (unit, lo, hi) of the flattened tp piece

    @property
    def piece_shape(self):
        """The shape of the tp piece (the global shape when replicated over tp)."""
        if self.tp is None:
            return tuple(self.shape)
        return self.tp.piece_shape(self.shape, self.tp_rank, self.tp_size)

    @property
    def local_size(self):
        """Elements this rank holds."""
        if self.flat is not None:
            return self.flat[2] - self.flat[1]
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
        if self.flat is None:
            return part
        _, lo, hi = self.flat
        return part.reshape(-1)[lo:hi]


def _put(values, axis, value):
    return tuple(value if i == axis else v for i, v in enumerate(values))


def placements(parallel, global_shapes, tp_comm=None):
    """{name: Placement} of every parameter this rank holds, read from a ``Parallelized``
    (its tensor-parallel cuts, its pipeline stages, its ZeRO-3 buckets).
    ``global_shapes``: {name: shape} of the plain model."""
    tp_specs = getattr(parallel.tp_model, "shard_specs", {}) if parallel.tp_model else {}
    rank, size = (tp_comm.rank, tp_comm.size) if tp_comm is not None else (0, 1)
    stage_of = _stages(parallel.module)
    flat_of = _zero3_ranges(parallel.sync)
    table = {}
    for name, _ in parallel.module.named_parameters():
        table[name] = Placement(name, tuple(global_shapes[name]), tp_specs.get(name),
                                rank, size, stage_of.get(name), flat_of.get(name))
    return table


def tp_placements(global_shapes, tp_model, tp_comm):
    """The tp part of the placements only (before the pipeline and ZeRO exist): what
    construction needs to cut a freshly drawn tensor to this rank's piece."""
    specs = getattr(tp_model, "shard_specs", {}) if tp_model is not None else {}
    rank, size = (tp_comm.rank, tp_comm.size) if tp_model is not None else (0, 1)
    return {n: Placement(n, tuple(s), specs.get(n), rank, size) for n, s in global_shapes.items()}


def _stages(module):
    """{name: virtual stage} when ``module`` is a pipeline rank's ``RankStages``."""
    out = {}
    for stage in getattr(module, "stages", []):
        for name, _ in stage.named_parameters():
            out[name] = stage.index
    return out


def _zero3_ranges(sync):
    """{name: (unit, lo, hi)}: the elements of each parameter (flattened tp piece) inside
    this rank's shard of its ZeRO-3 unit (lo == hi: none of them)."""
    if getattr(sync, "stage", 0) != 3:
        return {}
    out = {}
    for unit, b in enumerate(sync.buckets):
        start, stop = b.shard_range(sync.comm.rank)
        for p, off, shape in zip(b.params, b.offsets, b.shapes):
            n = math.prod(shape)
            lo, hi = max(start, off), min(stop, off + n)
            out[sync.names[id(p)]] = (unit, lo - off, max(lo, hi) - off)
    return out
