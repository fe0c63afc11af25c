"""ZeRO: shard what data parallelism replicates (Rajbhandari et al., 2020).

Plain data parallelism keeps, on every one of N replicas, all Ψ parameters, their
gradients and the optimizer state: 16Ψ bytes for fp32 AdamW (4 params + 4 grads +
8 for m and v).  ZeRO gives each rank a 1/N shard of each bucket (``buckets.py``)
and keeps only what it needs:

    stage 1  optimizer state sharded            4Ψ + 4Ψ + 8Ψ/N   = 8Ψ + 8Ψ/N
    stage 2  + gradients sharded                4Ψ + (4Ψ + 8Ψ)/N = 4Ψ + 12Ψ/N
    stage 3  + parameters sharded               (4Ψ + 4Ψ + 8Ψ)/N = 16Ψ/N

Stage 1: after backward, each bucket's gradients are reduce-scattered (a rank
receives the sum of its shard only); the optimizer step updates this rank's shard
(the Slot it gets from ``finish``) and ``publish`` all-gathers the updated shards.
Reduce-scatter + all-gather move the same bytes as one all-reduce, so stage 1 and 2
cost no more communication than data parallelism.

Stage 2: the reduce-scatter of a bucket starts from the gradient hooks as soon as
the bucket is complete, and the full gradients are freed at once: a rank never
holds more than one bucket of full gradients beyond its shard.

Stage 3 (``zero3.py``) also shards the parameters themselves.

Mixed precision: the shards, and only the shards, are fp32 masters; the model
computes with half weights all-gathered from half(master shard).  The global norm
sums each rank's shard over dp (``norm_comms``): ||g||² = Σ_ranks ||my shard||².
"""
from __future__ import annotations

import contextlib
import time

from minipar.backend import xp, memory, to_host, to_device
from minipar.comm import all_gather, reduce_scatter_async, reduce_scatter
from minipar.nn.init import is_placeholder
from minipar.parallel.buckets import make_buckets
from minipar.parallel.sync.slots import (ParamRules, Slot, broadcast_parameters, bucket_mask,
                                         value_source)


class ZeroSync:
    """ZeRO stage 1 or 2 over ``comm`` (the data-parallel group)."""

    def __init__(self, module, comm, rules=None, stage=1, bucket_bytes=25 * 2**20,
                 half_dtype=None, buckets=None, initial_piece=None):
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
        self.module, self.comm, self.stage = module, comm, stage
        self.rules = rules or ParamRules()
        self.norm_comms = (comm,)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in named}
        self.params = [p for _, p in named]
        self.value_of = value_source(self.names, initial_piece)
        if not any(is_placeholder(p.data) for p in self.params):
            broadcast_parameters(self.params, comm)   # drawn by name: equal on every rank
        self.buckets = buckets or make_buckets(self.params, bucket_bytes, pad_to=comm.size)
        self.half_dtype = half_dtype
        self.bucket_of = {}
        self.slots = [self._shard(b) for b in self.buckets]
        self.exposed_comm_s = 0.0

    def _shard(self, b):
        """Keep my shard of bucket ``b`` (fp32 master under mixed precision); ZeRO-1/2
        parameters become views of one flat storage, so publishing is one all-gather."""
        lo, hi = b.shard_range(self.comm.rank)
        # ZeRO-3 never builds the flat bucket, only my range of it (sharded construction)
        flat = b.pack_data(self.value_of) if self.stage < 3 else b.pack_range(lo, hi, self.value_of)
        r, dtype = self.rules, flat.dtype
        mask = lambda f: bucket_mask(b, self.names, f, dtype, lo, hi)  # noqa: E731
        decay = mask(lambda n, p: 1.0 if r.decays(n, p) else 0.0)
        weights = {r.norm_weight(self.names[id(p)]) for p, _, _ in b.ranges(lo, hi)}
        norm_weight = weights.pop() if len(weights) == 1 else mask(lambda n, p: r.norm_weight(n))
        partial = False                          # a bool mask only where it is needed
        if any(r.partial_over_tp(self.names[id(p)]) for p, _, _ in b.ranges(lo, hi)):
            partial = bucket_mask(b, self.names, lambda n, p: r.partial_over_tp(n), bool, lo, hi)
        if self.stage == 3:                      # flat is my shard already
            b.flat, b.param_shard = None, flat
            if self.half_dtype is not None:      # what is gathered: my shard in half
                b.half_shard = flat.astype(self.half_dtype)
                b.dtype = b.half_shard.dtype
        else:
            if self.half_dtype is not None:
                b.param_shard = flat[lo:hi].copy()
                flat = flat.astype(self.half_dtype)
                b.dtype = flat.dtype
            b.flat = flat
            for p, view in b.views(flat):
                p.data = memory.track(view)
            if self.half_dtype is None:
                b.param_shard = flat[lo:hi]
        b.grad_shard, b.pending = None, []
        for p in b.params:
            self.bucket_of[id(p)] = b
            if self.stage == 2:
                p.register_hook(self._grad_ready)
        return Slot(b.param_shard, None, decay, norm_weight, partial)

    def gather_source(self, bucket):
        """What the weights are all-gathered from: my shard, in the model's dtype."""
        if self.half_dtype is None:
            return bucket.param_shard
        if self.stage == 3:
            return bucket.half_shard
        return bucket.param_shard.astype(self.half_dtype)

    def no_sync(self):
        """Gradient accumulation needs nothing deferred: stage 1 reduce-scatters once, in
        ``finish``; stage 2 reduce-scatters each micro-batch's gradients as they arrive
        and sums the shards, so it never keeps full gradients (its memory saving)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------ gradients
    def _grad_ready(self, param):
        bucket = self.bucket_of[id(param)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._reduce_scatter(bucket, asynchronous=True)

    def _reduce_scatter(self, bucket, asynchronous):
        """Reduce-scatter the bucket's gradients.  The packed flat buffer is the
        collective's scratch (``inplace``) and my shard lands in an array of its own
        (``out``): nothing keeps the full buffer once the collective is done — were the
        result a view of it, every bucket's full gradients would live until ``finish``."""
        flat = self._grad_buffer(bucket)
        for p in bucket.params:       # the full gradients are not kept (stage 2's saving)
            p.grad = None
        flat *= 1.0 / self.comm.size
        bucket.ready = 0
        shard = xp.empty(bucket.shard_size, dtype=flat.dtype)
        if asynchronous:
            bucket.pending.append(reduce_scatter_async(self.comm, flat, out=shard, inplace=True))
        else:
            self._add_to_shard(bucket, reduce_scatter(self.comm, flat, out=shard, inplace=True))

    def _grad_buffer(self, bucket):
        """A flat buffer of the bucket's gradients that the reduce-scatter may overwrite."""
        return bucket.pack_grads()

    def _add_to_shard(self, bucket, shard):
        if bucket.grad_shard is None:
            bucket.grad_shard = shard          # a fresh array (``_reduce_scatter``'s out)
        else:
            bucket.grad_shard += shard

    def finish(self):
        """Complete every bucket's reduce-scatter; the slots' gradients are my shards of
        the averaged gradient (zeros where no gradient arrived), in the masters' dtype."""
        start = time.perf_counter()
        for bucket, slot in zip(self.buckets, self.slots):
            if self.stage == 1:
                self._reduce_scatter(bucket, asynchronous=False)
            for handle in bucket.pending:
                self._add_to_shard(bucket, handle.wait())
            bucket.pending = []
            g = bucket.grad_shard
            slot.grad = xp.zeros_like(slot.master) if g is None else g.astype(slot.master.dtype, copy=False)
            bucket.grad_shard = None
        self.exposed_comm_s = time.perf_counter() - start
        return self.slots

    def publish(self):
        """Stages 1-2 keep full weights: all-gather the updated shards into the flat
        storage the parameters are views of."""
        for b in self.buckets:
            all_gather(self.comm, self.gather_source(b), sizes=[b.shard_size] * self.comm.size,
                       out=b.flat)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        for slot in self.slots:
            slot.grad = None

    # ------------------------------------------------------------ checkpoints, accounting
    def to_named(self, arrays):
        """Full arrays by parameter name from every rank's per-bucket shards ``arrays``
        (masters, m, v).  Collective over the dp group."""
        out = {}
        for b, shard in zip(self.buckets, arrays):
            full = all_gather(self.comm, shard, sizes=[b.shard_size] * self.comm.size)
            for p, view in b.views(full):
                out[self.names[id(p)]] = to_host(view).copy()
        return {name: out[name] for name in self.names.values() if name in out}

    def from_named(self, named):
        """My shard of each bucket from full arrays by name (no communication)."""
        shards = []
        for b, slot in zip(self.buckets, self.slots):
            lo, hi = b.shard_range(self.comm.rank)
            flat = xp.zeros(b.padded, dtype=slot.master.dtype)
            for p, view in b.views(flat):
                view[...] = to_device(named[self.names[id(p)]])
            shards.append(flat[lo:hi].copy())
        return shards

    def memory_bytes(self):
        """Bytes this rank holds for weights and gradients (the fp32 master shard, under
        mixed precision, counts as optimizer state, as in the paper)."""
        item = self.buckets[0].dtype.itemsize     # of the weights the model computes with
        if self.stage < 3:
            params = sum(b.flat.nbytes for b in self.buckets)
        else:
            params = sum(b.shard_size * item for b in self.buckets)
        if self.stage == 1:
            grads = sum(p.size * item for p in self.params)   # full grads live in backward
        else:
            grads = sum(b.shard_size * item for b in self.buckets)
        masters = sum(b.param_shard.nbytes for b in self.buckets) if self.half_dtype else 0
        return {"params": params, "grads": grads, "optimizer": masters}
