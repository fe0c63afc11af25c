"""Data parallelism in the manner of PyTorch's DistributedDataParallel.

Every replica holds the whole model and a 1/dp share of the global batch.  If
each computes the mean loss of its share, the mean over replicas of their
gradients is the gradient of the global-batch loss:

    g = (1/dp) · Σ_r g_r        (one all-reduce, then a division)

so after the all-reduce every replica makes the same update as one process on
the whole batch.  To hide the all-reduce behind backward, gradients are packed
into buckets (``buckets.py``); a leaf hook counts the gradients arriving in each
bucket, and the moment a bucket is complete its comm hook (an all-reduce by
default, ``hooks.py``) is started, while backward goes on computing earlier layers:
on the communication thread where a core is free for it, else as a ring whose
messages this thread advances at every later gradient hook (``comm/stepwise.py``).  ``finish()`` waits for what is still in flight and
writes the averaged gradients back.

``no_sync()`` skips communication for gradient accumulation: K-1 micro-batches
accumulate locally, the K-th triggers the buckets with the summed gradients.

Mixed precision (``half_dtype``): the model's weights and gradients are fp16/bf16 and
the buckets travel in half; each bucket also has an fp32 master flat, which the
optimizer updates, and ``publish()`` rounds it back into the model (``flat.py``).
"""
from __future__ import annotations

import contextlib
import math
import sys
import time

from minipar.backend import to_device
from minipar.parallel.buckets import DEFAULT_BUCKET_MB, make_buckets
from minipar.parallel.placement import SlotRange
from minipar.parallel.sync.base import GradSync
from minipar.parallel.sync.flat import FlatStorage
from minipar.parallel.sync.hooks import allreduce_hook
from minipar.parallel.sync.slots import Slot, broadcast_parameters, value_source
from minipar.nn.init import is_placeholder


class DDPSync(GradSync):
    def __init__(self, module, comm, table=None, bucket_bytes=DEFAULT_BUCKET_MB * 2**20, algorithm="auto",
                 overlap=True, half_dtype=None, comm_hook=None, initial_piece=None,
                 mean_over=None):
        """``initial_piece(name)``: the values of parameters that are still placeholders
        (``nn/init.py``), drawn straight into the flat buffers."""
        super().__init__(module, comm, table, mean_over)
        self.overlap, self.half_dtype = overlap, half_dtype
        if not any(is_placeholder(p.data) for p in self.params):
            broadcast_parameters(self.params, comm)   # drawn by name: equal already
        self.comm_hook = comm_hook or allreduce_hook(algorithm)
        self.buckets = make_buckets(self.params, bucket_bytes, dtype=half_dtype)
        self.bucket_of = {}
        for i, bucket in enumerate(self.buckets):
            for p in bucket.params:
                self.bucket_of[id(p)] = i
                p.register_hook(self._grad_ready)
        self.flat = FlatStorage(self.buckets, self.names,
                                value_source(self.names, initial_piece), half_dtype)
        self.slots = [Slot(master, None, *self.slot_facts(b, master.dtype))
                      for b, master in zip(self.buckets, self.flat.masters)]
        self._grad_table = None      # (ends, norm weights) on the device, for flat_grads
        self.sync = True
        self.events = []             # (bucket index, submitted, started, finished) of the last sync
        self.submitted = [0.0] * len(self.buckets)   # when each bucket's hook was called
        self._saved_switch = None
        self._advanced = []          # in-flight handles this thread advances (stepwise)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally; the next backward outside syncs them all."""
        previous, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = previous

    def _grad_ready(self, param):
        bucket = self.buckets[self.bucket_of[id(param)]]
        if not self.sync or self.comm.size == 1:
            return
        bucket.ready += 1
        if bucket.ready == len(bucket.params) and self.overlap:
            self._launch(self.bucket_of[id(param)])
        for h in self._advanced:          # move the in-flight rings on (never blocks)
            h.progress()

    # While an all-reduce runs on the communication thread, the main thread is busy in
    # backward and holds Python's GIL; the thread needs it between two messages of the
    # ring and by default waits up to 5 ms for it.  A shorter switch interval while
    # buckets are in flight lets the thread move on after each message.
    SWITCH_INTERVAL_S = 1e-4

    def _launch(self, i):
        bucket = self.buckets[i]
        self.submitted[i] = time.perf_counter()
        bucket.handle = self.comm_hook(self.comm, self.flat.grads(i))
        if hasattr(bucket.handle, "progress"):      # advanced by us, in this thread
            self._advanced.append(bucket.handle)
        elif self._saved_switch is None:            # on the progress thread
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.SWITCH_INTERVAL_S)

    def finish(self):
        """Wait for (or, without overlap, run) every bucket's hook; write back the
        averaged gradients; returns the slots, gradients in the masters' dtype."""
        self._average()
        if self.mean_over != self.comm.size:    # the hook's mean over comm, made over mean_over
            for flat in self.flat.grad_flats:
                flat *= self.comm.size / self.mean_over
        for slot, g in zip(self.slots, self.flat.master_grads()):
            slot.grad = g
        return self.slots

    def _average(self):
        self.exposed_comm_s = 0.0
        if self.comm.size == 1:
            return
        start = time.perf_counter()
        self.events = []
        for i, bucket in enumerate(self.buckets):
            if bucket.handle is None:          # not launched: no overlap, or unused params
                self._launch(i)
            h = bucket.handle
            flat = h.wait()
            self.events.append((i, self.submitted[i], getattr(h, "started_at", self.submitted[i]),
                                getattr(h, "finished_at", time.perf_counter())))
            target = self.flat.grad_flats[i]
            if flat is not target:             # a hook that returned a new array
                target[...] = flat
            bucket.handle, bucket.ready = None, 0
        self._advanced = []
        if self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None
        self.exposed_comm_s = time.perf_counter() - start

    def in_flight(self):
        return [b.handle for b in self.buckets if b.handle is not None]

    def flat_grads(self):
        """Mixed precision: (buffer, ends, norm weights) — every fp32 master gradient back
        to back in one device array (``FlatStorage.master_grad``), where each parameter's
        ends (int32) and its w in ||g||² (float32) — for the optimizer step's one-launch
        unscale, check and norm; None otherwise."""
        buffer = self.flat.master_grad
        if buffer is None or buffer.size > 2**31 - 1:
            return None
        if self._grad_table is None:              # the same every step: moved to the device once
            ends, weights = self.flat.master_grad_table(lambda n: self.table[n].norm_weight)
            self._grad_table = (to_device(ends), to_device(weights))
        return (buffer, *self._grad_table)

    def publish(self):
        self.flat.publish()

    def zero_grad(self):
        self.flat.zero_grad()                   # one fill per bucket; the views stay
        for slot in self.slots:
            slot.grad = None

    # ------------------------------------------------------------ ownership, checkpoints
    def slot_ranges(self):
        """Every bucket whole, on every rank of the group: the first one counts it."""
        out = {}
        for i, b in enumerate(self.buckets):
            for p, off, shape in zip(b.params, b.offsets, b.shapes):
                out[self.names[id(p)]] = SlotRange(i, 0, math.prod(shape), off,
                                                   self.comm.size, self.comm.rank == 0)
        return out

    def to_named(self, arrays):
        """{name: host array} of per-slot arrays (every replica holds them all)."""
        return self.flat.to_named(arrays)

    def from_named(self, named):
        return self.flat.from_named(named, self.slots[0].master.dtype)

    def memory_bytes(self):
        """Weights and gradients held here; fp32 masters (mixed precision) count as the
        optimizer's, as in the ZeRO paper (the step adds its m and v)."""
        model = sum(w.nbytes for w in self.flat.weights)
        if self.half_dtype is None:
            return {"params": model, "grads": model, "optimizer": 0}
        master = sum(m.nbytes for m in self.flat.masters)
        return {"params": model + master, "grads": model + master, "optimizer": 0}
