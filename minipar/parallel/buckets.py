"""Gradient buckets: parameters packed into flat buffers, communicated as units.

One all-reduce of 25 MB costs far less than a thousand all-reduces of 25 KB (each
message pays the latency α), so data parallelism groups gradients into buckets of
about ``bucket_bytes``.  Parameters are bucketed in *reverse* order of the model
because backward produces gradients from the last layer to the first: the first
bucket fills first and its all-reduce starts while backward is still running.

A bucket's flat length is padded to a multiple of the data-parallel size ``n`` so
ZeRO can give every rank an equal shard: rank r owns elements
[r·L/n, (r+1)·L/n) of each bucket.
"""
from __future__ import annotations

import math

import numpy

from minipar.backend import to_device, xp

DEFAULT_BUCKET_MB = 25.0    # the largest size a run chooses (perf/bucket_size.py), PyTorch
                            # DDP's default: the memory model's bound before a run has chosen


def bucket_bytes(config):
    """The bucket size in bytes a config runs with: its own ``bucket_mb``, else the
    largest a run may choose (a bound, for the memory model before the run chose)."""
    mb = config.bucket_mb if config.bucket_mb is not None else DEFAULT_BUCKET_MB
    return int(mb * 2**20)


class Bucket:
    def __init__(self, params, pad_to, dtype=None):
        """``dtype``: what the bucket's flat arrays hold (default the parameters'; mixed
        precision: the half dtype its gradients travel in)."""
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]    # kept: ZeRO-3 frees the storage
        self.offsets = []
        total = 0
        for p in self.params:
            self.offsets.append(total)
            total += p.size
        self.numel = total
        self.padded = -(-total // pad_to) * pad_to if total else 0
        self.shard_size = self.padded // pad_to if pad_to else 0
        self.dtype = xp.dtype(dtype) if dtype is not None else self.params[0].dtype
        # DDP's progress through a step (read by its comm hooks): gradients arrived in
        # this backward, and the bucket's in-flight collective
        self.ready = 0
        self.handle = None

    def views(self, flat):
        """(param, view of ``flat`` shaped like the param) pairs."""
        for p, off, shape in zip(self.params, self.offsets, self.shapes):
            size = 1
            for n in shape:
                size *= n
            yield p, flat[off:off + size].reshape(shape)

    def pack_grads(self):
        """A new flat buffer holding every param's grad (zeros where there is none, and
        over the padding): one ``concatenate`` (one kernel on a GPU, not a copy per
        parameter)."""
        pieces = [p.grad.reshape(-1).astype(self.dtype, copy=False) if p.grad is not None else
                  xp.zeros(int(numpy.prod(shape)), dtype=self.dtype)
                  for p, shape in zip(self.params, self.shapes)]
        if self.padded > self.numel:
            pieces.append(xp.zeros(self.padded - self.numel, dtype=self.dtype))
        return xp.concatenate(pieces) if pieces else xp.zeros(self.padded, dtype=self.dtype)

    def pack_data(self, value_of=None, dtype=None):
        """A new flat buffer of the weights (in ``dtype``, default the bucket's);
        ``value_of(param)`` gives them (default ``param.data``), one parameter at a time."""
        flat = xp.zeros(self.padded, dtype=dtype or self.dtype)
        for p, view in self.views(flat):
            view[...] = p.data if value_of is None else to_device(value_of(p))
        return flat

    def ranges(self, lo, hi):
        """(param, start, stop) for each param overlapping elements [lo, hi) of the flat
        buffer: the overlap, in flat coordinates."""
        for p, off, shape in zip(self.params, self.offsets, self.shapes):
            start, stop = max(lo, off), min(hi, off + math.prod(shape))
            if start < stop:
                yield p, start, stop

    def pack_range(self, lo, hi, value_of, dtype=None):
        """Elements [lo, hi) of the flat weights, building nothing else: each overlapping
        parameter's values come from ``value_of(param)`` (a host or device array of its
        shape, made one at a time — ZeRO-3's sharded construction), in ``dtype`` (default
        the bucket's)."""
        flat = xp.zeros(hi - lo, dtype=dtype or self.dtype)
        offset = dict(zip(map(id, self.params), self.offsets))
        for p, start, stop in self.ranges(lo, hi):
            off = offset[id(p)]
            flat[start - lo:stop - lo] = to_device(value_of(p).reshape(-1)[start - off:stop - off])
        return flat

    def shard_range(self, rank):
        return rank * self.shard_size, (rank + 1) * self.shard_size


def make_buckets(params, bucket_bytes, pad_to=1, dtype=None):
    """Split ``params`` (in reverse model order) into buckets of at most ~bucket_bytes of
    ``dtype`` (default each parameter's own); a parameter larger than that gets a bucket
    of its own.  Dtypes never mix."""
    buckets, current, size = [], [], 0
    for p in reversed(list(params)):
        nbytes = p.size * (xp.dtype(dtype) if dtype is not None else p.dtype).itemsize
        if current and (size + nbytes > bucket_bytes or p.dtype != current[0].dtype):
            buckets.append(Bucket(current, pad_to, dtype))
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(Bucket(current, pad_to, dtype))
    return buckets
