"""How a parameter is cut across the tp ranks, and how to put it back together.

A :class:`Shard` names the axis a weight is split along.  Rank r owns rows/columns
``chunk_bounds(n, t)[r] : chunk_bounds(n, t)[r+1]`` of it (the array_split rule of
``minipar.comm``: parts differ by at most one, which is how a vocabulary that does not
divide by t is handled — no padding, no masked logits).

``groups`` cuts each of G equal blocks of the axis separately.  The attention's qkv
weight (d, 3d) has columns [q | k | v], each head-major; with ``groups=3`` rank r gets
[q_r | k_r | v_r], the q, k and v columns of *its* heads, which is exactly the layout
``CausalSelfAttention.split_heads`` expects of a module with n_head/t heads:

    W_qkv (d, 3d) ──reshape──> (d, 3, d) ──keep [:, :, r·d/t:(r+1)·d/t]──> (d, 3·d/t)

``replicas`` holds each part on that many consecutive ranks: the axis is cut into
t/replicas parts and rank r holds part r // replicas.  Grouped-query attention with
more tp ranks than key/value heads uses it (``tensor/llama.py``): each KV head's
columns live on the t/n_kv_head ranks whose query heads read it.

Parameters without a Shard are replicated on every tp rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from minipar.backend import xp
from minipar.comm import all_gather, chunk_bounds


@dataclass(frozen=True)
class Shard:
    axis: int
    groups: int = 1
    replicas: int = 1

    def bounds(self, full_shape, size):
        """Where each of the size/replicas parts starts, per group (chunk_bounds)."""
        return chunk_bounds(full_shape[self.axis] // self.groups, size // self.replicas)

    def part(self, full_shape, rank, size):
        """(lo, hi): rank ``rank``'s range of each group along the axis."""
        b = self.bounds(full_shape, size)
        return b[rank // self.replicas], b[rank // self.replicas + 1]

    def piece_shape(self, full_shape, rank, size):
        lo, hi = self.part(full_shape, rank, size)
        shape = list(full_shape)
        shape[self.axis] = self.groups * (hi - lo)
        return tuple(shape)

    def _grouped(self, a, module=None):
        """a with the split axis first and cut into (groups, n, ...)."""
        a = (module or xp).moveaxis(a, self.axis, 0)
        return a.reshape((self.groups, a.shape[0] // self.groups) + a.shape[1:])

    def local(self, full, rank, size, module=None):
        """Rank ``rank``'s piece of the full array (a contiguous copy).  ``module``: the
        array library of ``full`` (default the backend's; NumPy for host arrays)."""
        m = module or xp
        lo, hi = self.part(full.shape, rank, size)
        part = self._grouped(full, m)[:, lo:hi]
        part = part.reshape((-1,) + part.shape[2:])
        return m.ascontiguousarray(m.moveaxis(part, 0, self.axis))

    def join(self, pieces):
        """The full array from every rank's piece (in rank order; one of each part's
        replicas is read)."""
        pieces = pieces[::self.replicas]
        full = xp.concatenate([self._grouped(p) for p in pieces], axis=1)
        full = full.reshape((-1,) + full.shape[2:])
        return xp.ascontiguousarray(xp.moveaxis(full, 0, self.axis))


def gather_full(comm, spec, local, full_shape):
    """Collective: the full array on every rank, from each rank's ``local`` piece."""
    if comm.size == 1:
        return local
    shapes = [spec.piece_shape(full_shape, r, comm.size) for r in range(comm.size)]
    sizes = [math.prod(s) for s in shapes]
    flat = all_gather(comm, xp.ascontiguousarray(local), sizes=sizes)
    pieces, start = [], 0
    for shape, n in zip(shapes, sizes):
        pieces.append(flat[start:start + n].reshape(shape))
        start += n
    return spec.join(pieces)


def named_modules(module, prefix=""):
    """(dotted name, module) for ``module`` and every sub-module, parents first."""
    yield prefix, module
    for name, child in module.children():
        yield from named_modules(child, prefix + name + ".")


def shard_table(model):
    """{parameter name: Shard} gathered from the layers' own ``shards`` attributes
    (the single source of truth about how each parallel layer is cut)."""
    table = {}
    for prefix, module in named_modules(model):
        for pname, spec in getattr(module, "shards", {}).items():
            if getattr(module, pname, None) is not None:
                table[prefix + pname] = spec
    return table
