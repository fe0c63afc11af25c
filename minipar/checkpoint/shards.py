"""What one rank owns, as boxes of global tensors: the bridge from a synchroniser's
flat arrays to a checkpoint's pieces, used both ways (write and reshard-on-read).

Every array the optimizer step updates is a *slot* (``parallel/sync``): a whole tp piece
(DDP under mixed precision), one flat bucket of pieces (DDP), or this rank's range of a
flat bucket (ZeRO 1-3).  ``slot_segments`` says, per slot, which elements of which
parameter it holds:

    (name, lo, hi, start):  elements [lo, hi) of the flattened tp piece of ``name``
                            are elements [start, start + hi - lo) of the slot

and the placement (``parallel/placement.py``) turns a piece's elements into global boxes:

    [lo, hi) of the piece --flat_to_boxes--> piece boxes --Placement.to_global--> global boxes

Writing walks this chain from the slot to the boxes (``owned_pieces``); loading walks it
back (``read_slot``), reading each global box from whatever pieces the checkpoint has —
the same code for every layout, which is why any layout can read any other's.

Replicas are written once: a slot replicated over the data-parallel group (DDP: every
dp × cp rank holds it) is written by the group's rank 0 only, and a parameter replicated
over tp (norms, biases of row-parallel layers) by tp rank 0 only (``writes``).  ZeRO
shards are disjoint, so every dp rank writes its own.
"""
from __future__ import annotations

import numpy as np

from minipar.checkpoint.boxes import flat_to_boxes, relative, size


def slot_segments(sync):
    """Per slot (in ``sync.slots`` order): [(name, lo, hi, start)] as above."""
    if hasattr(sync, "stage"):                            # ZeRO: my range of each bucket
        out = []
        for b in sync.buckets:
            lo, hi = b.shard_range(sync.comm.rank)
            offset = dict(zip(map(id, b.params), b.offsets))
            out.append([(sync.names[id(p)], s - offset[id(p)], e - offset[id(p)], s - lo)
                        for p, s, e in b.ranges(lo, hi)])
        return out
    if sync.flat is not None:                             # DDP: whole buckets
        return [[(sync.flat.names[id(p)], 0, int(np.prod(shape)), off)
                 for p, off, shape in zip(b.params, b.offsets, b.shapes)] for b in sync.buckets]
    return [[(name, 0, int(np.prod(s.master.shape)), 0)]  # DDP + fp32 masters: per parameter
            for name, s in zip(sync.names, sync.slots)]


def writes(sync, placement):
    """Does this rank write its copy of ``placement``'s parameter (replicas: once)?
    Replicated over dp (DDP slots): dp rank 0 writes; over tp: tp rank 0; a tp part held
    by several tp ranks (``Shard.replicas``: a KV head copied for grouped-query
    attention): the first of them."""
    sharded_over_dp = hasattr(sync, "stage")
    tp = placement.tp
    first_holder = placement.tp_rank == 0 if tp is None else placement.tp_rank % tp.replicas == 0
    return (sharded_over_dp or sync.comm.rank == 0) and first_holder


def owned_pieces(kind, flat, segments, table):
    """(kind, name, global shape, global box, values) of every box a slot's ``flat`` host
    array holds (``segments``: its entry of ``slot_segments``; ``table``: placements)."""
    for name, lo, hi, start in segments:
        p = table[name]
        for box in flat_to_boxes(p.piece_shape, lo, hi):
            block = flat[start:start + size(box)].reshape(box[1])
            start += size(box)
            for part, global_box in p.to_global(box):
                yield kind, name, p.shape, global_box, block[relative(part, box)]


def read_slot(checkpoint, kind, flat, segments, table):
    """Fill a slot's ``flat`` host array from ``checkpoint``: each box is read from the
    saved pieces it intersects (``Checkpoint.read``), nothing else."""
    for name, lo, hi, start in segments:
        p = table[name]
        for box in flat_to_boxes(p.piece_shape, lo, hi):
            block = np.empty(box[1], dtype=flat.dtype)
            for part, global_box in p.to_global(box):
                block[relative(part, box)] = checkpoint.read(kind, name, global_box)
            flat[start:start + size(box)] = block.reshape(-1)
            start += size(box)

