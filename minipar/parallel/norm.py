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
    def __init__(self, comms=(), weight=None):
        self.comms = [c for c in comms if c is not None and c.size > 1]
        self.weight = weight or (lambda name: 1.0)

    def local_sq(self, named_grads):
        """Σ w_p ||g_p||² over (name, grad) pairs held here."""
        return sum(sum_of_squares(g, self.weight(name)) for name, g in named_grads if g is not None)

    def of_slots(self, slots):
        """||g|| from a synchroniser's slots (each with its own norm weights)."""
        return self.total(sum(sum_of_squares(s.grad, s.norm_weight) for s in slots
                              if s.grad is not None))

    def squares_of_slots(self, slots):
        """[||g||²] as a float64 array of the backend, summed over the groups but not read:
        the caller reads it once, with anything else it needs from the device."""
        return self.summed(sum(sum_of_squares(s.grad, s.norm_weight) for s in slots
                               if s.grad is not None))

    def summed(self, local_sq):
        """[Σ_groups local_sq] as a float64 array (1,) of the backend."""
        value = xp.asarray(local_sq, dtype=xp.float64).reshape(1)
        for comm in self.comms:
            value = all_reduce(comm, value)
        return value

    def total(self, local_sq):
        """sqrt of the sum of ``local_sq`` over the groups."""
        return math.sqrt(float(to_host(self.summed(local_sq))[0]))
