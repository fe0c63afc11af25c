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
the buckets travel in half; ``amp.MixedPrecision`` keeps the fp32 masters the
optimizer updates, and ``publish()`` rounds them back into the model.
"""
from __future__ import annotations

import contextlib
import sys
import time

import numpy

from minipar.nn.init import initialise, is_placeholder
from minipar.parallel.buckets import make_buckets
from minipar.parallel.sync.flat import FlatStorage
from minipar.parallel.sync.hooks import allreduce_hook
from minipar.parallel.sync.slots import ParamRules, Slot, broadcast_parameters, value_source


class DDPSync:
    norm_comms = ()     # every replica holds every gradient: nothing to sum over dp

    def __init__(self, module, comm, rules=None, bucket_bytes=25 * 2**20, algorithm="auto",
                 overlap=True, half_dtype=None, comm_hook=None, initial_piece=None):
        """``initial_piece(name)``: the values of parameters that are still placeholders
        (``nn/init.py``), drawn straight into the flat buffers."""
        self.module, self.comm, self.overlap = module, comm, overlap
        self.rules = rules or ParamRules()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        value_of = value_source({id(p): n for n, p in named}, initial_piece)
        if any(is_placeholder(p.data) for p in self.params):
            if half_dtype is not None:         # the masters are made from the weights
                initialise(module, initial_piece)
        else:
            broadcast_parameters(self.params, comm)   # drawn by name: equal already
        self.amp = None
        if half_dtype is not None:             # fp32 masters; the model (and buckets) in half
            from minipar.amp import MixedPrecision
            self.amp = MixedPrecision(named, half_dtype)
        self.comm_hook = comm_hook or allreduce_hook(algorithm)
        self.buckets = make_buckets(self.params, bucket_bytes)
        self.bucket_of = {}
        for bucket in self.buckets:
            for p in bucket.params:
                self.bucket_of[id(p)] = bucket
                p.register_hook(self._grad_ready)
        # fp32/fp64: parameters and gradients as views of one flat pair per bucket
        # (``flat.py``); mixed precision keeps per-parameter fp32 masters (``amp``)
        self.flat = None
        if self.amp is None:
            self.flat = FlatStorage(self.buckets, {id(p): n for n, p in named}, value_of)
            self.slots = self.flat.slots(self.rules)
        else:
            r = self.rules
            self.slots = [Slot(m.data, None, 1.0 if r.decays(n, p) else 0.0, r.norm_weight(n),
                               r.partial_over_tp(n))
                          for n, p, m in zip(self.names, self.params, self.amp.masters)]
        self._grad_table = None      # (ends, norm weights) on the device, for flat_grads
        self.sync = True
        self.exposed_comm_s = 0.0    # time spent waiting for communication in the last step
        self.events = []             # (bucket index, submitted, started, finished) of the last sync
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
        bucket = self.bucket_of[id(param)]
        if not self.sync or self.comm.size == 1:
            return
        bucket.ready += 1
        if bucket.ready == len(bucket.params) and self.overlap:
            self._launch(bucket)
        for h in self._advanced:          # move the in-flight rings on (never blocks)
            h.progress()

    # While an all-reduce runs on the communication thread, the main thread is busy in
    # backward and holds Python's GIL; the thread needs it between two messages of the
    # ring and by default waits up to 5 ms for it.  A shorter switch interval while
    # buckets are in flight lets the thread move on after each message.
    SWITCH_INTERVAL_S = 1e-4

    def _bucket_grads(self, bucket):
        """The flat gradient to communicate: the bucket's own buffer, or a packed copy."""
        return self.flat.grads(bucket) if self.flat else bucket.pack_grads()

    def _launch(self, bucket):
        bucket.submitted = time.perf_counter()
        bucket.handle = self.comm_hook(self.comm, self._bucket_grads(bucket))
        if hasattr(bucket.handle, "progress"):      # advanced by us, in this thread
            self._advanced.append(bucket.handle)
        elif self._saved_switch is None:            # on the progress thread
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.SWITCH_INTERVAL_S)

    def finish(self):
        """Wait for (or, without overlap, run) every bucket's hook; write back the
        averaged gradients; returns the slots, gradients in the masters' dtype."""
        self._average()
        if self.flat is not None:
            grads = [self.flat.grads(b) for b in self.buckets]
        else:
            self.amp.grads_to_masters()
            grads = self.amp.master_grads()
        for slot, g in zip(self.slots, grads):
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
                bucket.submitted = time.perf_counter()
                bucket.handle = self.comm_hook(self.comm, self._bucket_grads(bucket))
            h = bucket.handle
            flat = h.wait()
            self.events.append((i, bucket.submitted, getattr(h, "started_at", bucket.submitted),
                                getattr(h, "finished_at", time.perf_counter())))
            if self.flat is not None:
                if flat is not bucket.flat_grad:   # a hook that returned a new array
                    bucket.flat_grad[...] = flat
            else:
                for p, view in bucket.views(flat):
                    p.grad = view
            bucket.handle, bucket.ready = None, 0
        self._advanced = []
        if self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None
        self.exposed_comm_s = time.perf_counter() - start

    def flat_grads(self):
        """Mixed precision: (buffer, ends, norm weights) — every fp32 master gradient back to
        back in one device array, where each ends (int32) and its w in ||g||² (float32) — for
        the optimizer step's one-launch unscale, check and norm; None otherwise."""
        flat = self.amp.flat_grads() if self.amp is not None else None
        if flat is None or flat[0].size > 2**31 - 1:
            return None
        if self._grad_table is None:              # the same every step: moved to the device once
            from minipar.backend import to_device
            weights = numpy.array([float(s.norm_weight) for s in self.slots], dtype=numpy.float32)
            self._grad_table = (to_device(flat[1].astype(numpy.int32)), to_device(weights))
        return (flat[0], *self._grad_table)

    def publish(self):
        if self.amp is not None:
            self.amp.masters_to_model()

    def zero_grad(self):
        if self.flat is not None:
            self.flat.zero_grad()               # one fill per bucket; the views stay
        else:
            for p in self.params:
                p.grad = None
            self.amp.zero_grad()
        for slot in self.slots:
            slot.grad = None

    # ------------------------------------------------------------ checkpoints, accounting
    def to_named(self, arrays):
        """{name: host array} of per-slot arrays (every replica holds them all)."""
        if self.flat is not None:
            return self.flat.to_named(arrays)
        from minipar.backend import to_host
        return {n: to_host(a).copy() for n, a in zip(self.names, arrays)}

    def from_named(self, named):
        if self.flat is not None:
            return self.flat.from_named(named, self.slots[0].master.dtype)
        from minipar.backend import to_device
        return [to_device(named[n], dtype=s.master.dtype) for n, s in zip(self.names, self.slots)]

    def memory_bytes(self):
        """Weights and gradients held here; fp32 masters (mixed precision) count as the
        optimizer's, as in the ZeRO paper (the step adds its m and v)."""
        model = sum(p.data.nbytes for p in self.params)
        if self.amp is None:
            return {"params": model, "grads": model, "optimizer": 0}
        master = sum(m.data.nbytes for m in self.amp.masters)
        return {"params": model + master, "grads": model + master, "optimizer": 0}
