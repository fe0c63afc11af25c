"""What one rank owns, as boxes of global tensors: the bridge from a synchroniser's
flat arrays to a checkpoint's pieces, used both ways (write and reshard-on-read).

Every array the optimizer step updates is a *slot* (``parallel/sync``): one flat bucket
of pieces (DDP), or this rank's range of a flat bucket (ZeRO 1-3).  Each parameter's
placement (``parallel/placement.py``) says which elements of it a slot holds — its
``owned`` SlotRange, gathered per slot by ``placement.slot_segments``:

    (name, lo, hi, start):  elements [lo, hi) of the flattened tp piece of ``name``
                            are elements [start, start + hi - lo) of the slot

and turns a piece's elements into global boxes:

    [lo, hi) of the piece --flat_to_boxes--> piece boxes --Placement.to_global--> global boxes

Writing walks this chain from the slot to the boxes (``owned_pieces``); loading walks it
back (``read_slot``), reading each global box from whatever pieces the checkpoint has —
the same code for every layout, which is why any layout can read any other's.

Replicas are written once, by the holder the placement counts them on
(``Placement.counted_here``): a slot replicated over the data-parallel group (DDP: every
dp × cp rank holds it) by the group's rank 0, a parameter replicated over tp (norms,
biases of row-parallel layers) by tp rank 0, a KV head copied for grouped-query
attention by the first of its holders.  ZeRO shards are disjoint, so every dp rank
writes its own.
"""
from __future__ import annotations

import numpy as np

from minipar.checkpoint.boxes import flat_to_boxes, relative, size


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

