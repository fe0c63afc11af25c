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

Stage 3 (``zero3.py``, a subclass) also shards the parameters themselves.

Mixed precision: the shards, and only the shards, are fp32 masters; the model
computes with half weights all-gathered from half(master shard).  The global norm
sums each rank's shard over dp (``norm_comms``): ||g||² = Σ_ranks ||my shard||².
Per bucket and step that is one pack of the half gradients (``Bucket.pack_grads``: one
``concatenate``), one cast of my shard up into the step's one fp32 buffer of master
gradients (``flat_grads``: the optimizer's unscale, overflow check and squares are then
one kernel launch over every bucket), one AdamW, one cast down and one all-gather.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy

from minipar.backend import xp, memory, to_host, to_device
from minipar.comm import all_gather, reduce_scatter_async, reduce_scatter
from minipar.nn.init import is_placeholder
from minipar.parallel.buckets import DEFAULT_BUCKET_MB, make_buckets
from minipar.parallel.placement import SlotRange
from minipar.parallel.sync.base import GradSync
from minipar.parallel.sync.slots import Slot, broadcast_parameters, value_source


@dataclass
class Shard:
    """What a ZeRO rank keeps of one bucket, beside the bucket's (immutable) layout."""
    master: Any                  # my shard of the weights: what the optimizer updates
    flat: Any = None             # stages 1-2: the full flat weights the params view
    half: Any = None             # stage 3, mixed precision: my shard in the model's dtype
    grad: Any = None             # my shard of this step's averaged gradient
    pending: list = None         # in-flight reduce-scatters of this bucket
    ready: int = 0               # gradients arrived in this backward (stage 2's trigger)


class ZeroSync(GradSync):
    """ZeRO stage 1 or 2 over ``comm`` (the data-parallel group)."""

    shards_weights = False     # ZeRO-3 (a subclass) keeps only its range of the weights too

    def __init__(self, module, comm, table=None, stage=1, bucket_bytes=DEFAULT_BUCKET_MB * 2**20,
                 half_dtype=None, buckets=None, initial_piece=None, mean_over=None):
        if stage not in (1, 2) and not self.shards_weights:
            raise ValueError(f"ZeroSync is ZeRO stage 1 or 2 (stage 3 is Zero3Sync), got {stage}")
        super().__init__(module, comm, table, mean_over)
        self.stage = stage
        self.norm_comms = (comm,)
        self.value_of = value_source(self.names, initial_piece)
        if not any(is_placeholder(p.data) for p in self.params):
            broadcast_parameters(self.params, comm)   # drawn by name: equal on every rank
        self.buckets = buckets or make_buckets(self.params, bucket_bytes, pad_to=comm.size,
                                               dtype=half_dtype)
        self.half_dtype = half_dtype
        self.bucket_of = {}
        self.shards = []
        for i, b in enumerate(self.buckets):
            lo, hi = b.shard_range(comm.rank)
            self.shards.append(self._hold(b, lo, hi))
            for p in b.params:
                self.bucket_of[id(p)] = i
                if self.stage == 2:
                    p.register_hook(self._grad_ready)
        self.slots = [Slot(state.master, None,
                           *self.slot_facts(b, state.master.dtype, *b.shard_range(comm.rank)))
                      for b, state in zip(self.buckets, self.shards)]
        # mixed precision: my shards' fp32 gradients back to back, from ``finish`` to
        # ``zero_grad`` (bucket i at bounds[i]:bounds[i + 1]), and its (ends, norm weights)
        self.shard_bounds = numpy.cumsum([0] + [b.shard_size for b in self.buckets])
        self.master_grad = None
        self._grad_table = None

    def _hold(self, b, lo, hi):
        """Stages 1-2: the full flat weights (the parameters become views of it, so
        publishing is one all-gather) and my shard of them as the master (an fp32 copy
        under mixed precision)."""
        master_dtype = xp.float32 if self.half_dtype is not None else None
        values = b.pack_data(self.value_of, master_dtype)
        flat = values if self.half_dtype is None else values.astype(self.half_dtype)
        for p, view in b.views(flat):
            p.data = memory.track(view)
        master = flat[lo:hi] if self.half_dtype is None else values[lo:hi].copy()
        return Shard(master, flat=flat, pending=[])

    def gather_source(self, i):
        """What bucket i's weights are all-gathered from: my shard, in the model's dtype."""
        master = self.shards[i].master
        return master if self.half_dtype is None else master.astype(self.half_dtype)

    def no_sync(self):
        """Gradient accumulation needs nothing deferred: stage 1 reduce-scatters once, in
        ``finish``; stage 2 reduce-scatters each micro-batch's gradients as they arrive
        and sums the shards, so it never keeps full gradients (its memory saving)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------ gradients
    def _grad_ready(self, param):
        i = self.bucket_of[id(param)]
        shard = self.shards[i]
        shard.ready += 1
        if shard.ready == len(self.buckets[i].params):
            self._reduce_scatter(i, asynchronous=True)

    def _reduce_scatter(self, i, asynchronous):
        """Reduce-scatter bucket i's gradients.  The packed flat buffer is the
        collective's scratch (``inplace``) and my shard lands in an array of its own
        (``out``): nothing keeps the full buffer once the collective is done — were the
        result a view of it, every bucket's full gradients would live until ``finish``."""
        bucket, state = self.buckets[i], self.shards[i]
        flat = self._grad_buffer(i)
        for p in bucket.params:       # the full gradients are not kept (stage 2's saving)
            p.grad = None
        flat *= 1.0 / self.mean_over
        state.ready = 0
        out = xp.empty(bucket.shard_size, dtype=flat.dtype)
        if asynchronous:
            state.pending.append(reduce_scatter_async(self.comm, flat, out=out, inplace=True))
        else:
            self._add_to_shard(state, reduce_scatter(self.comm, flat, out=out, inplace=True))

    def _grad_buffer(self, i):
        """A flat buffer of bucket i's gradients that the reduce-scatter may overwrite."""
        return self.buckets[i].pack_grads()

    @staticmethod
    def _add_to_shard(state, shard):
        if state.grad is None:
            state.grad = shard                 # a fresh array (``_reduce_scatter``'s out)
        else:
            state.grad += shard

    def finish(self):
        """Complete every bucket's reduce-scatter; the slots' gradients are my shards of
        the averaged gradient (zeros where no gradient arrived), in the masters' dtype."""
        start = time.perf_counter()
        if self.half_dtype is not None:
            self.master_grad = xp.empty(int(self.shard_bounds[-1]), dtype=xp.float32)
        for i, (state, slot) in enumerate(zip(self.shards, self.slots)):
            if self.stage == 1:
                self._reduce_scatter(i, asynchronous=False)
            for handle in state.pending:
                self._add_to_shard(state, handle.wait())
            state.pending = []
            g = state.grad
            if self.master_grad is not None:    # one cast up, into the master buffer
                slot.grad = self.master_grad[int(self.shard_bounds[i]):int(self.shard_bounds[i + 1])]
                slot.grad[...] = 0 if g is None else g
            else:
                slot.grad = xp.zeros_like(slot.master) if g is None else g.astype(slot.master.dtype, copy=False)
            state.grad = None
        self.exposed_comm_s = time.perf_counter() - start
        return self.slots

    def flat_grads(self):
        """Mixed precision: (buffer, ends, norm weights) — my shards' fp32 gradients back to
        back in one device array, where each parameter's piece ends (int32; a shard's last
        piece through its padding, which is zero) and its w in ||g||² (float32) — for the
        optimizer step's one-launch unscale, check and norm; None otherwise."""
        buffer = self.master_grad
        if buffer is None or buffer.size > 2**31 - 1:
            return None
        if self._grad_table is None:              # the same every step: moved to the device once
            ends, weights = [], []
            for i, b in enumerate(self.buckets):
                base, (lo, hi) = int(self.shard_bounds[i]), b.shard_range(self.comm.rank)
                pieces = list(b.ranges(lo, hi))
                for j, (p, _, stop) in enumerate(pieces):
                    ends.append(base + (hi - lo if j == len(pieces) - 1 else stop - lo))
                    weights.append(self.table[self.names[id(p)]].norm_weight)
                if not pieces:                    # a shard of padding alone: zeros
                    ends.append(base + hi - lo)
                    weights.append(0.0)
            self._grad_table = (to_device(numpy.array(ends, dtype=numpy.int32)),
                                to_device(numpy.array(weights, dtype=numpy.float32)))
        return (buffer, *self._grad_table)

    def in_flight(self):
        """The reduce-scatters started from gradient hooks (stage 2) not yet waited for."""
        return [h for state in self.shards for h in state.pending]

    def publish(self):
        """Stages 1-2 keep full weights: all-gather the updated shards into the flat
        storage the parameters are views of."""
        for i, (b, state) in enumerate(zip(self.buckets, self.shards)):
            all_gather(self.comm, self.gather_source(i), sizes=[b.shard_size] * self.comm.size,
                       out=state.flat)

    def zero_grad(self):
        self.master_grad = None
        for p in self.params:
            p.grad = None
        for slot in self.slots:
            slot.grad = None

    # ------------------------------------------------------------ ownership, checkpoints
    def slot_ranges(self):
        """My range of each bucket: the elements of each parameter (its flattened tp
        piece) inside it, held by this rank alone (lo == hi: none of them)."""
        out = {}
        for i, b in enumerate(self.buckets):
            start, stop = b.shard_range(self.comm.rank)
            for p, off, shape in zip(b.params, b.offsets, b.shapes):
                lo = min(max(start, off), off + math.prod(shape))
                hi = max(lo, min(stop, off + math.prod(shape)))
                out[self.names[id(p)]] = SlotRange(i, lo - off, hi - off, lo - start,
                                                   weights_sharded=self.shards_weights)
        return out

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
        params = sum(state.flat.nbytes for state in self.shards)
        if self.stage == 1:
            grads = sum(p.size * item for p in self.params)   # full grads live in backward
        else:
            grads = sum(b.shard_size * item for b in self.buckets)
        masters = sum(state.master.nbytes for state in self.shards) if self.half_dtype else 0
        return {"params": params, "grads": grads, "optimizer": masters}
