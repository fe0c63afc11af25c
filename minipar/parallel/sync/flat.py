"""Flat buffers: every parameter and its gradient a view into one array per bucket.

A model of P parameter tensors costs, per step, P small operations for each thing done
to "the gradients": P copies to pack them into a bucket before the all-reduce, P copies
back, P calls of every ufunc in AdamW (about a dozen each), P fills to zero them.  On a
CPU each call costs microseconds of Python whatever its size; on a GPU each is a kernel
launch.  If instead each bucket owns two flat arrays,

    weights[off_i : off_i + n_i]  is parameter i      grads[off_i : off_i + n_i]  its gradient

then backward accumulates straight into ``grads`` (a leaf's ``p.grad`` *is* the view), the
all-reduce runs on ``grads`` in place with no packing, the optimizer updates the weights
with one call per ufunc per bucket, and zeroing is one ``fill(0)``.  PyTorch's DDP keeps its
buckets as such views of the gradients (``gradient_as_bucket_view``); its fused AdamW and
Megatron's distributed optimizer run on flat buffers too.

Mixed precision (``half_dtype``): the model computes with half weights, so the views are
half, and each bucket also has an fp32 *master* flat (what the optimizer updates) and an
fp32 master gradient — all the buckets' master gradients back to back in one buffer, so
the loss scaler's unscale, its overflow check and the norm's squares take every gradient
in one kernel launch (``master_grad_table``); it exists from ``finish`` to ``zero_grad``.  Per bucket and step that is one cast of
the gradient up (``grads_to_masters``) and one rounding of the weights down (``publish``),
not one per parameter — Megatron's ``_ParamAndGradBuffer`` with its main-gradient buffer.

Anything that replaces a ``p.grad`` (``module.zero_grad()`` sets None) is caught:
``grads(i)`` copies a replaced gradient back into its view and re-attaches the view.
"""
from __future__ import annotations

import numpy

from minipar.backend import memory, to_device, to_host, xp


class FlatStorage:
    """Parameters and gradients of ``buckets`` as views of one flat pair per bucket (and,
    with ``half_dtype``, fp32 master flats behind them)."""

    def __init__(self, buckets, names, value_of=None, half_dtype=None):
        self.buckets, self.names = buckets, names          # names: {id(param): name}
        self.weights, self.grad_flats, self.grad_views = [], [], []
        self.masters = []          # what the optimizer updates: the weights, or fp32 copies
        for b in buckets:          # value_of: draws placeholders into the flat (slots.py)
            values = b.pack_data(value_of, None if half_dtype is None else xp.float32)
            weights = values if half_dtype is None else values.astype(half_dtype)
            memory.track(weights)
            for p, view in b.views(weights):
                p.data = view
            grad = memory.track(xp.zeros(b.padded, dtype=weights.dtype))
            views = [view for _, view in b.views(grad)]
            for p, view in zip(b.params, views):
                p.grad = view
            self.weights.append(weights)
            self.grad_flats.append(grad)
            self.grad_views.append(views)
            self.masters.append(values if half_dtype is None else memory.track(values))
        # mixed precision: one fp32 buffer of every bucket's master gradient, made when a
        # step's gradients are in (``master_grads``) and dropped by ``zero_grad``, so it
        # never adds to the peak of forward and backward
        self.half = half_dtype is not None
        self.bounds = numpy.cumsum([0] + [b.padded for b in buckets])
        self.master_grad = None

    def grads(self, i):
        """Bucket i's flat gradient, every parameter's ``grad`` its view again."""
        for p, view in zip(self.buckets[i].params, self.grad_views[i]):
            if p.grad is not view:
                if p.grad is None:
                    view[...] = 0
                else:
                    view[...] = p.grad
                p.grad = view
        return self.grad_flats[i]

    def master_grads(self):
        """Per bucket, the gradient in the masters' dtype: the flat itself, or (mixed
        precision) its fp32 copy, one cast per bucket into the one master buffer."""
        if not self.half:
            return [self.grads(i) for i in range(len(self.buckets))]
        if self.master_grad is None:
            self.master_grad = memory.track(xp.empty(int(self.bounds[-1]), dtype=xp.float32))
        out = []
        for i in range(len(self.buckets)):
            view = self.master_grad[int(self.bounds[i]):int(self.bounds[i + 1])]
            view[...] = self.grads(i)
            out.append(view)
        return out

    def master_grad_table(self, norm_weight_of):
        """(ends, weights) over ``master_grad``: per parameter, where its gradient ends
        (each bucket's last one through the bucket's padding, which is zero) and its w in
        ||g||² = Σ w·g² (``norm_weight_of(name)``).  Host arrays: int32, float32."""
        ends, weights = [], []
        for i, b in enumerate(self.buckets):
            base = int(self.bounds[i])
            for j, (p, off, shape) in enumerate(zip(b.params, b.offsets, b.shapes)):
                last = j == len(b.params) - 1
                ends.append(base + (b.padded if last else off + int(numpy.prod(shape))))
                weights.append(norm_weight_of(self.names[id(p)]))
        return numpy.array(ends, dtype=numpy.int32), numpy.array(weights, dtype=numpy.float32)

    def publish(self):
        """Mixed precision: the model's half weights from the masters, one rounding per
        bucket (w_half = round-to-nearest(w32)); nothing to do otherwise."""
        if self.half:
            for weights, master in zip(self.weights, self.masters):
                weights[...] = master

    def zero_grad(self):
        self.master_grad = None
        for b, grad, views in zip(self.buckets, self.grad_flats, self.grad_views):
            grad.fill(0)
            for p, view in zip(b.params, views):
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
