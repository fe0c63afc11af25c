"""Ulysses attention: the sequence split turned into a head split, and back, by all-to-all.

Ring attention keeps each rank's queries and moves the keys round.  DeepSpeed-Ulysses
moves the *layout* instead: rank u of a group of U holds S/U positions of every head;
one all-to-all makes it hold all S positions of H/U heads.  Attention runs whole on
those heads (no merge, any kernel, no mask bookkeeping); a second all-to-all turns the
output back into "my positions, all heads" for the projection and the MLP:

    q, k, v  (B, H, S/U, d)  --all-to-all-->  (B, H/U, S, d)  --attention-->  o (B, H/U, S, d)
    o        (B, H/U, S, d)  --all-to-all-->  (B, H, S/U, d)

q, k and v travel in one all-to-all (each destination's block is its query heads, then
its key heads, then its value heads), so a forward pass makes two, and backward two
more: the gradient of an all-to-all is the inverse all-to-all.  U is capped by the
heads: it must divide the query heads H, and each rank must get whole key/value heads.
With Hkv < U key/value heads (grouped-query attention), each is repeated U/Hkv times
before the swap, as verl's Ulysses does, so rank u gets one (its query heads all read
it); backward sums the copies' gradients.  Hkv' = max(Hkv, U) heads travel.

**Bytes per rank, one attention layer, forward and backward** (e bytes a number; an
all-to-all keeps 1/U of its block and sends the rest):

    Ulysses (U = C):   4·(H + Hkv')·B·(S/C)·d·e·(U-1)/U
    ring (C ranks):    (3C-2)·2·B·Hkv·(S/C)·d·e           (ring.py: K,V round twice, dK,dV once)

The ring's volume per rank stays ~6·B·Hkv·S·d·e whatever C is (C-1 hops of a block
that shrinks as 1/C); Ulysses' shrinks as 1/C, but needs C <= H, and its messages go
to every rank of the group at once (an all-to-all, which a slow link between nodes pays
in full), where the ring's go to one neighbour, overlapped with compute.

**The hybrid** (USP: Unified Sequence Parallelism): cp = U·R ranks; groups of U
consecutive cp ranks run Ulysses, and the R groups form a ring (rank u of each group
with rank u of the others).  The sequence is cut for the ring: 2R zig-zag chunks, group
g holding chunks g and 2R-1-g; inside the group each chunk is cut again in U pieces,
rank u holding piece u of both (``ulysses_positions``).  After the swap rank u holds
its group's two whole chunks for H/U heads, exactly a ring rank's layout, and ring
attention runs over the R groups with Hkv'/U key/value heads.  Bytes per rank:

    4·(H + Hkv')·B·(S/C)·d·e·(U-1)/U  +  (3R-2)·2·B·(Hkv'/U)·(S/R)·d·e

U = C is pure Ulysses (R = 1: the ring is one rank, plain attention), U = 1 pure ring.
"""
from __future__ import annotations

import numpy as np

from minipar.autograd import Function
from minipar.backend import xp
from minipar.comm import all_to_all
from minipar.nn.module import Module
from minipar.parallel.context.ring import RingAttentionCore
from minipar.parallel.context.split import chunks_of


# ---------------------------------------------------------------- who holds what
def check_ulysses(n_head, n_kv_head, cp, ulysses, tp=1):
    """Raise ValueError unless a Ulysses degree ``ulysses`` can split the heads one
    tensor-parallel rank holds (n_head/tp query heads, max(n_kv_head/tp, 1) key/value
    heads) inside a cp group of ``cp`` ranks."""
    if ulysses < 1 or cp % ulysses:
        raise ValueError(f"`cp_ulysses` {ulysses} must divide `cp` {cp} (Ulysses runs in groups "
                         f"of cp_ulysses ranks, the ring across the cp/cp_ulysses groups)")
    heads, kv_heads = n_head // tp, max(n_kv_head // tp, 1)
    each = " per tensor-parallel rank" if tp > 1 else ""
    if heads % ulysses:
        raise ValueError(f"{heads} query heads{each} cannot be split over a Ulysses degree of "
                         f"{ulysses}: each rank takes whole heads; choose `cp_ulysses` in "
                         f"{[u for u in range(1, heads + 1) if heads % u == 0 and cp % u == 0]}")
    if kv_heads % ulysses and ulysses % kv_heads:
        raise ValueError(f"{kv_heads} key/value heads{each} and a Ulysses degree of {ulysses}: one "
                         f"must divide the other (each rank takes whole key/value heads, "
                         f"repeated when there are fewer than cp_ulysses)")


def kv_repeats(n_kv_head, ulysses):
    """How many copies of each key/value head travel: U/Hkv when Hkv < U, else 1."""
    return ulysses // n_kv_head if n_kv_head < ulysses else 1


def bytes_per_rank(batch, heads, kv_heads, seq_len, head_dim, itemsize, cp, ulysses):
    """Bytes one rank sends for one attention layer, forward and backward (the module
    docstring's formula): ``heads``, ``kv_heads`` those of one tensor-parallel rank;
    ``ulysses`` 1 is the ring alone."""
    ring = cp // ulysses
    travelling = max(kv_heads, ulysses)
    swaps = 4 * (heads + travelling) * batch * (seq_len // cp) * head_dim * itemsize
    hops = (3 * ring - 2) * 2 * batch * (travelling // ulysses) * (seq_len // ring) * head_dim
    return swaps * (ulysses - 1) // ulysses + (hops * itemsize if ring > 1 else 0)


def ulysses_positions(rank, cp, ulysses, seq_len, zigzag=True):
    """The sequence positions cp rank ``rank`` holds, in their local order: piece u
    (of U) of each of its group's two ring chunks (group g = rank // U, u = rank % U)."""
    group, u = divmod(rank, ulysses)
    ring = cp // ulysses
    chunk = seq_len // (2 * ring)
    piece = chunk // ulysses
    return np.concatenate([np.arange(j * chunk + u * piece, j * chunk + (u + 1) * piece)
                           for j in chunks_of(group, ring, zigzag)])


def ulysses_groups(cp_comm, ulysses):
    """(ulysses_comm, ring_comm) of this cp rank: its group of U consecutive ranks, and
    the R = cp/U ranks with its place u in the other groups.  Both count their bytes
    into ``cp_comm``'s totals.  Collective over ``cp_comm``."""
    group, u = divmod(cp_comm.rank, ulysses)
    return (cp_comm.split(color=group, key=u, share_counters=True),
            cp_comm.split(color=u, key=group, share_counters=True))


# ---------------------------------------------------------------- the swap, on arrays
def _by_destination(x, ranks, parts):
    """(B, Σparts, n, d), parts one after another on the head axis -> (U, B, Σparts/U, n, d):
    block t holds the t-th U-th of every part's heads, part after part."""
    b, _, n, d = x.shape
    pieces, start = [], 0
    for heads in parts:
        pieces.append(x[:, start:start + heads].reshape(b, ranks, heads // ranks, n, d))
        start += heads
    return xp.ascontiguousarray(xp.concatenate(pieces, axis=2).transpose(1, 0, 2, 3, 4))


def _from_sources(blocks, parts):
    """The inverse of ``_by_destination``: (U, B, Σparts/U, n, d) -> (B, Σparts, n, d)."""
    ranks, b, _, n, d = blocks.shape
    pieces, start = [], 0
    for heads in parts:
        share = heads // ranks
        pieces.append(blocks[:, :, start:start + share].transpose(1, 0, 2, 3, 4)
                      .reshape(b, heads, n, d))
        start += share
    return xp.concatenate(pieces, axis=1)


def _gather_sequence(blocks):
    """(U, B, h, n, d) from sources 0..U-1, each n = two pieces -> (B, h, U·n, d) laid out
    [first chunk: pieces of 0..U-1 | second chunk: pieces of 0..U-1]."""
    ranks, b, h, n, d = blocks.shape
    return (blocks.reshape(ranks, b, h, 2, n // 2, d).transpose(1, 2, 3, 0, 4, 5)
            .reshape(b, h, ranks * n, d))


def _scatter_sequence(y, ranks):
    """The inverse of ``_gather_sequence``: (B, h, U·n, d) -> (U, B, h, n, d), block t
    rank t's two pieces."""
    b, h, length, d = y.shape
    n = length // ranks
    return xp.ascontiguousarray(y.reshape(b, h, 2, ranks, n // 2, d).transpose(3, 0, 1, 2, 4, 5)
                                .reshape(ranks, b, h, n, d))


def _exchange(comm, blocks):
    """All-to-all of U equal blocks: block t to rank t; returns block s from rank s."""
    return all_to_all(comm, blocks, [1] * comm.size)[0]


def sequence_to_heads(comm, x, parts):
    """My positions of all heads, (B, Σparts, n, d) -> all the group's positions of my
    heads, (B, Σparts/U, U·n, d) (my share of each part, part after part)."""
    return _gather_sequence(_exchange(comm, _by_destination(x, comm.size, parts)))


def heads_to_sequence(comm, y, parts):
    """The inverse of ``sequence_to_heads``: (B, Σparts/U, U·n, d) -> (B, Σparts, n, d)."""
    return _from_sources(_exchange(comm, _scatter_sequence(y, comm.size)), parts)


# ---------------------------------------------------------------- differentiable
class QKVToHeads(Function):
    """q (B, H, n, d), k, v (B, Hkv, n, d) -> [q | k | v] of my heads, (B, (H + 2Hkv')/U,
    U·n, d), in one all-to-all; k, v repeated ``repeats`` times first.  Backward: the
    inverse all-to-all, the copies' gradients summed."""

    @staticmethod
    def forward(ctx, q, k, v, comm, repeats):
        if repeats > 1:
            k, v = xp.repeat(k, repeats, axis=1), xp.repeat(v, repeats, axis=1)
        parts = (q.shape[1], k.shape[1], v.shape[1])
        ctx.comm, ctx.parts, ctx.repeats = comm, parts, repeats
        return sequence_to_heads(comm, xp.concatenate([q, k, v], axis=1), parts)

    @staticmethod
    def backward(ctx, grad):
        h, hkv, _ = ctx.parts
        g = heads_to_sequence(ctx.comm, grad, ctx.parts)
        gq, gk, gv = g[:, :h], g[:, h:h + hkv], g[:, h + hkv:]
        if ctx.repeats > 1:
            b, _, n, d = gk.shape
            gk = gk.reshape(b, hkv // ctx.repeats, ctx.repeats, n, d).sum(axis=2)
            gv = gv.reshape(b, hkv // ctx.repeats, ctx.repeats, n, d).sum(axis=2)
        return gq, gk, gv, None, None


class HeadsToSequence(Function):
    """Attention's output (B, H/U, U·n, d) -> (B, H, n, d), my positions of every head.
    Backward: the forward swap."""

    @staticmethod
    def forward(ctx, y, comm):
        ctx.comm, ctx.parts = comm, (y.shape[1] * comm.size,)
        return heads_to_sequence(comm, y, ctx.parts)

    @staticmethod
    def backward(ctx, grad):
        return sequence_to_heads(ctx.comm, grad, ctx.parts), None


class UlyssesAttentionCore(Module):
    """The attention core of a Ulysses (or hybrid) context-parallel model: swap to heads,
    attend (ring attention across the groups, plain attention when there is one group),
    swap back."""

    def __init__(self, ulysses_comm, ring_comm, kind="naive", zigzag=True, implementation=None):
        self.ulysses_comm = ulysses_comm
        self.kind, self.implementation = kind, implementation
        self.ring = RingAttentionCore(ring_comm, kind, zigzag, implementation)

    def forward(self, q, k, v):
        comm = self.ulysses_comm
        h, hkv = q.shape[1], k.shape[1]
        repeats = kv_repeats(hkv, comm.size)
        heads = QKVToHeads.apply(q, k, v, comm, repeats)
        mine, mine_kv = h // comm.size, hkv * repeats // comm.size
        y = self.ring(heads[:, :mine], heads[:, mine:mine + mine_kv], heads[:, mine + mine_kv:])
        return HeadsToSequence.apply(y, comm)


def apply_ulysses(model, cp_comm, ulysses, zigzag=True):
    """Make ``model`` (plain or tensor-parallel GPT) hold this rank's positions, every
    block's attention core a Ulysses core over groups of ``ulysses`` cp ranks."""
    cfg = model.config
    ulysses_comm, ring_comm = ulysses_groups(cp_comm, ulysses)
    model.token_positions = ulysses_positions(cp_comm.rank, cp_comm.size, ulysses, cfg.seq_len,
                                              zigzag)
    for block in model.blocks:
        core = block.attn.core
        block.attn.core = UlyssesAttentionCore(ulysses_comm, ring_comm, core.kind, zigzag,
                                               core.implementation)
    return model
