"""The global gradient norm, when each rank holds only part of the gradient.

Clipping must use ||g|| of the *whole* model's gradient.  A rank computes the
weighted squared norm of what it holds and the parts are summed over the groups
that hold other parts:

    ||g||² = Σ_groups Σ_elements  w · g²

- ZeRO shards hold different pieces of every bucket: sum over ``dp_comm``;
- pipeline stages hold different layers: sum over ``pp_comm``;
- tensor-parallel ranks hold different slices of a sharded weight: sum over
  ``tp_comm``; a weight replicated on all t ranks (LayerNorm, biases of row-parallel
  layers, positions) would be counted t times, so its weight is w = 1/t.

Under fp16 loss scaling the overflow flag must be agreed by EVERY rank that steps
together, a larger set than the groups above (DDP's dp replicas hold the same
gradient and are not summed over).  Both then travel in ONE all-reduce over the world:

    [ Σ w·g² / copies ,  flag ]   summed over every rank
    copies = world size / Π group sizes    (ranks holding the same part: DDP's dp·cp)

The first element is ||g||² again (each part counted copies times, 1/copies each: the
w = 1/t rule above, applied to whole replicas); the second is > 0 iff some rank's
gradient holds inf or NaN (flags are >= 0, so their sum is their "any").  One
collective instead of one per group plus one for the flag; without loss scaling the
groups are summed one by one as above (no flag to agree, and over the groups alone).

This is the only place the norm is computed; ``optim.global_grad_norm`` is the
one-process case (no groups, w = 1).
"""
from __future__ import annotations

import math

from minipar.autograd.ops_math import fused_kernels
from minipar.backend import xp, to_host, is_device_array
from minipar.comm import all_reduce


def sum_of_squares(grad, weight=1.0):
    """Σ w·g² in float64 (``weight`` a number or an array shaped like ``grad``); one
    compiled pass where the CPU kernels take ``grad`` (``kernels/fused_cpu.py``).
    A float on the host; on a device a 0-d device array, so that summing the parameters'
    parts costs no device->host wait (``float`` here would be one per parameter)."""
    if isinstance(weight, (int, float)) and (fused := fused_kernels("sum_of_squares", grad)):
        return weight * fused.sum_of_squares(grad)
    total = (weight * grad.astype(xp.float64) ** 2).sum()
    return total if is_device_array(total) else float(total)


class GlobalNorm:
    """``comms``: the groups holding other parts of the gradient; ``weight(name)``: w;
    ``world``: every rank that steps together, for ``summed_with_flag`` (None: one
    process, or no flag to agree)."""

    def __init__(self, comms=(), weight=None, world=None):
        self.comms = [c for c in comms if c is not None and c.size > 1]
        self.weight = weight or (lambda name: 1.0)
        self.world = world if world is not None and world.size > 1 else None
        held = math.prod(c.size for c in self.comms)
        if self.world is not None and self.world.size % held:
            raise ValueError(f"the norm's groups ({held} ranks in all) do not tile the "
                             f"world of {self.world.size} ranks")
        self.copies = self.world.size // held if self.world is not None else 1

    def local_sq(self, named_grads):
        """Σ w_p ||g_p||² over (name, grad) pairs held here."""
        return sum(sum_of_squares(g, self.weight(name)) for name, g in named_grads if g is not None)

    def local_sq_of_slots(self, slots):
        """Σ w·g² over a synchroniser's slots held here (each with its own norm weights):
        a float on the host, a 0-d float64 array on a device; not summed over the groups."""
        return sum(sum_of_squares(s.grad, s.norm_weight) for s in slots if s.grad is not None)

    def summed(self, local_sq):
        """[Σ_groups local_sq] as a float64 array (1,) of the backend."""
        value = xp.asarray(local_sq, dtype=xp.float64).reshape(1)
        for comm in self.comms:
            value = all_reduce(comm, value)
        return value

    def summed_with_flag(self, local_sq, flag):
        """[||g||², Σ_world flag] as a float64 array (2,) of the backend, in one all-reduce
        over ``world`` (see the module docstring); without a world, the squares summed over
        the groups and the flag as it is."""
        if self.world is None:
            return xp.concatenate([self.summed(local_sq), xp.asarray(flag, dtype=xp.float64)])
        local = xp.asarray(local_sq, dtype=xp.float64).reshape(1) / self.copies
        return all_reduce(self.world, xp.concatenate([local, xp.asarray(flag, dtype=xp.float64)]))

    def total(self, local_sq):
        """sqrt of the sum of ``local_sq`` over the groups."""
        return math.sqrt(float(to_host(self.summed(local_sq))[0]))
