"""Flat buffers: every parameter and its gradient a view into one array per bucket.

A model of P parameter tensors costs, per step, P small operations for each thing done
to "the gradients": P copies to pack them into a bucket before the all-reduce, P copies
back, P calls of every ufunc in AdamW (about a dozen each), P fills to zero them.  On a
CPU each call costs microseconds of Python whatever its size; on a GPU each is a kernel
launch.  If instead each bucket owns two flat arrays,

    data[off_i : off_i + n_i]  is parameter i        grad[off_i : off_i + n_i]  its gradient

then backward accumulates straight into ``grad`` (a leaf's ``p.grad`` *is* the view), the
all-reduce runs on ``grad`` in place with no packing, the optimizer updates ``data`` with
one call per ufunc per bucket, and zeroing is one ``fill(0)``.  PyTorch's DDP keeps its
buckets as such views of the gradients (``gradient_as_bucket_view``); its fused AdamW
and Megatron's distributed optimizer run on flat buffers too.

What the optimizer step needs per element — weight decay on matrices only, the norm
weight of tp-replicated weights, the tp-partial mask — becomes a mask over the bucket
(``slots.bucket_mask``), as for ZeRO's shards.  Anything that replaces a ``p.grad``
(``module.zero_grad()`` sets None) is caught: ``grads(bucket)`` copies a replaced
gradient back into its view and re-attaches the view.
"""
from __future__ import annotations

from minipar.backend import memory, to_device, to_host, xp
from minipar.parallel.sync.slots import Slot, bucket_mask


class FlatStorage:
    """Parameters and gradients of ``buckets`` as views of one flat pair per bucket."""

    def __init__(self, buckets, names, value_of=None):
        self.buckets, self.names = buckets, names          # names: {id(param): name}
        for b in buckets:         # value_of: draws placeholders into the flat (slots.py)
            b.flat = memory.track(b.pack_data(value_of))
            for p, view in b.views(b.flat):
                p.data = view
            b.flat_grad = memory.track(xp.zeros(b.padded, dtype=b.dtype))
            b.grad_views = [view for _, view in b.views(b.flat_grad)]
            for p, view in zip(b.params, b.grad_views):
                p.grad = view

    def slots(self, rules):
        """One Slot per bucket: the flat weights, and per-element masks of the rules."""
        out = []
        for b in self.buckets:
            mask = lambda f: bucket_mask(b, self.names, f, b.dtype)  # noqa: E731
            decay = mask(lambda n, p: 1.0 if rules.decays(n, p) else 0.0)
            weights = {rules.norm_weight(self.names[id(p)]) for p in b.params}
            norm = weights.pop() if len(weights) == 1 else mask(lambda n, p: rules.norm_weight(n))
            partial = False             # a bool mask only where some parameter is partial
            if any(rules.partial_over_tp(self.names[id(p)]) for p in b.params):
                partial = bucket_mask(b, self.names, lambda n, p: rules.partial_over_tp(n), bool)
            out.append(Slot(b.flat, None, decay, norm, partial))
        return out

    def grads(self, bucket):
        """The bucket's flat gradient, every parameter's ``grad`` its view again."""
        for p, view in zip(bucket.params, bucket.grad_views):
            if p.grad is not view:
                if p.grad is None:
                    view[...] = 0
                else:
                    view[...] = p.grad
                p.grad = view
        return bucket.flat_grad

    def zero_grad(self):
        for b in self.buckets:
            b.flat_grad.fill(0)
            for p, view in zip(b.params, b.grad_views):
                p.grad = view

    def to_named(self, arrays):
        """{name: host array} of per-bucket flat arrays (masters, m, v)."""
        out = {}
        for b, flat in zip(self.buckets, arrays):
            for p, view in b.views(flat):
                out[self.names[id(p)]] = to_host(view).copy()
        return out

    def from_named(self, named, dtype):
        """Per-bucket flat arrays from {name: array}."""
        flats = []
        for b in self.buckets:
            flat = xp.zeros(b.padded, dtype=dtype)
            for p, view in b.views(flat):
                view[...] = to_device(named[self.names[id(p)]])
            flats.append(flat)
        return flats
