"""DiLoCo's state in the sharded checkpoint.

A DiLoCo run is saved at an outer step, where every group holds the global weights θ.
So the checkpoint holds, in the same global boxes as any run's state:

    param, adam_m, adam_v      group 0's weights (= θ) and inner AdamW state, under the
                               names a run without DiLoCo writes (it can resume them)
    adam_m.group{g}, ...       group g's own inner state (g >= 1): the groups trained on
                               different rows, so their moments differ
    outer_momentum             the outer Nesterov buffer b, written like adam_m
    meta["diloco"]             {"groups": G, "inner_steps": H}

Resuming, group g reads the inner state of the saved group g mod G_saved: under the same
G (any inner layout: the boxes are global) every group continues exactly; under another
G each group continues from the same θ and b with the inner state of a saved group.
"""
from __future__ import annotations

INNER_KINDS = ("adam_m", "adam_v")


def group_kind(kind, group):
    """The checkpoint kind of group ``group``'s inner state ``kind``."""
    return kind if group == 0 else f"{kind}.group{group}"


def saved_group(meta, group):
    """The saved group whose inner state group ``group`` of this run resumes."""
    return group % int((meta.get("diloco") or {}).get("groups", 1))


def inner_kinds(meta, group):
    """kind -> the kind group ``group`` reads its inner state from, resuming ``meta``'s
    checkpoint."""
    source = saved_group(meta, group)
    return lambda kind: group_kind(kind, source) if kind in INNER_KINDS else kind


def meta_of(outer, config):
    """The index's record of the groups."""
    return {"groups": outer.groups.count, "inner_steps": config.inner_steps}


def checkpoint_pieces(outer, pieces, table):
    """What this rank writes, from the pieces a run without DiLoCo would (``saving.
    local_pieces``): group 0 adds the outer momentum; a later group writes only its
    inner state, renamed, and its compression state.  Collective (``slot_momentum``)."""
    from minipar.checkpoint.shards import owned_pieces
    from minipar.parallel.placement import slot_segments
    momentum = outer.slot_momentum()
    g = outer.groups.group
    if g > 0:
        return [(group_kind(p[0], g),) + tuple(p[1:]) for p in pieces if p[0] in INNER_KINDS] + \
               [p for p in pieces if p[0] == "hook"]
    slots = outer.sync.slots
    for i, segments in enumerate(slot_segments(table, len(slots))):
        segments = [s for s in segments if table[s[0]].counted_here]
        pieces += owned_pieces("outer_momentum", momentum[i], segments, table)
    return pieces


def load_outer_state(outer, ckpt, table):
    """The outer momentum from ``ckpt`` (zero when it was written without DiLoCo)."""
    import numpy as np
    from minipar.backend import to_host
    from minipar.checkpoint.shards import read_slot
    from minipar.parallel.placement import slot_segments
    if not ckpt.names("outer_momentum"):
        return
    slots = outer.sync.slots
    arrays = []
    for slot, segments in zip(slots, slot_segments(table, len(slots))):
        flat = np.zeros(slot.master.size, dtype=to_host(slot.master.reshape(-1)[:0]).dtype)
        read_slot(ckpt, "outer_momentum", flat, segments, table)
        arrays.append(flat)
    outer.load_slot_momentum(arrays)
