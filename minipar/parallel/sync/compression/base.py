"""What every compression hook shares: finding its bucket, the progress thread, the
bytes it sent, warm-up steps and checkpointable state.

A DDP comm hook is ``hook(comm, flat) -> handle`` with ``handle.wait()`` the averaged
gradient (1/n)·Σ_r g_r.  A compressing hook replaces the exchange of ``flat`` by the
exchange of something smaller and returns the average of what the ranks *sent*.

**Which bucket is this?**  DDP hands the hook a fresh flat buffer, not the bucket, but a
method with memory (error feedback, PowerSGD's Q) must know which bucket's state to use,
and PowerSGD needs the parameter shapes inside it.  So a stateful hook is bound to the
synchroniser once it exists (``hook.bind(sync)``) and then recognises the bucket at each
call: every step calls every bucket exactly once; the bucket being called is one not yet
called this step, of the buffer's length, whose handle DDP has not yet set, preferring
the one whose gradients are all in (``ready == len(params)``: that is the bucket DDP's
gradient hook has just completed) and else the first in bucket order (what ``finish()``
launches, in order).  After all buckets are called, a step is counted.

**Where it runs.**  The whole method — however many dependent collectives it needs
(PowerSGD: all-reduce P, orthogonalise, Q = MᵀP, all-reduce Q) — is ONE function
submitted to the communicator's progress thread (``comm.nonblocking.submit``): it
overlaps with backward like the default all-reduce, its collectives stay in the FIFO
order every rank agrees on, and only that function ever touches the bucket's state
until ``handle.wait()`` returns.

**Bytes.**  The function runs on the progress thread's private context, which nothing
else uses, so the transport's counter before and after it is exactly what this bucket
sent.  ``pop_stats()`` returns the step's totals.
"""
from __future__ import annotations

import threading

from minipar.backend import is_half, to_device, to_host, xp
from minipar.comm import all_reduce
from minipar.comm.nonblocking import submit
from minipar.parallel.sync.compression.wire import ring_all_reduce_bytes


class CompressionHook:
    """Base of the hooks; subclasses write ``reduce(ctx, flat, index)``."""

    name = "none"
    stateful = True          # needs bind(): keeps state per bucket or counts warm-up steps

    def __init__(self, algorithm="ring", start=0):
        self.algorithm = algorithm   # of the all-reduces inside (ring: the formulas hold)
        self.start = int(start)      # steps of plain all-reduce before compressing
        self.step = 0                # steps seen (all buckets called once each)
        self.buckets = None
        self.names = None            # per bucket: the parameter names in it
        self.residual = {}           # bucket index -> flat error-feedback residual
        self._called = set()
        self._lock = threading.Lock()
        self._wire = self._dense = 0

    # ------------------------------------------------------------------ binding
    def bind(self, sync):
        """Attach to a ``DDPSync`` (or a list of ``Bucket``\\ s); returns the hook."""
        from minipar.parallel.sync.base import GradSync
        buckets, by_id = (sync.buckets, sync.names) if isinstance(sync, GradSync) else (list(sync), {})
        self.buckets = buckets
        self.names = [[by_id.get(id(p), f"bucket{i}.param{j}") for j, p in enumerate(b.params)]
                      for i, b in enumerate(buckets)]
        self.setup()
        return self

    def setup(self):
        """Per-bucket preparation once the buckets are known (PowerSGD: the matrices)."""

    def _which_bucket(self, flat):
        if self.buckets is None:
            raise RuntimeError(f"the {self.name} hook keeps state per bucket: call "
                               "hook.bind(sync) after building DDPSync(..., comm_hook=hook)")
        free = [i for i, b in enumerate(self.buckets)
                if i not in self._called and b.padded == flat.size and b.handle is None]
        if not free:
            raise RuntimeError(f"{self.name} hook: no bucket of {flat.size} elements is due "
                               "in this step (was it bound to this synchroniser?)")
        full = [i for i in free if self.buckets[i].ready == len(self.buckets[i].params)]
        return (full or free)[0]

    # ------------------------------------------------------------------ the call
    def __call__(self, comm, flat):
        if not self.stateful and self.buckets is None:
            return submit(comm, self._run, flat, None, True)
        index = self._which_bucket(flat)
        compress = self.step >= self.start
        self._called.add(index)
        if len(self._called) == len(self.buckets):
            self._called.clear()
            self.step += 1
        return submit(comm, self._run, flat, index, compress)

    def _run(self, ctx, flat, index, compress):
        before = ctx.bytes_sent
        out = self.reduce(ctx, flat, index) if compress else self.dense(ctx, flat)
        sent = ctx.bytes_sent - before
        with self._lock:
            self._wire += sent
            self._dense += ring_all_reduce_bytes(flat.size, flat.itemsize, ctx.size, ctx.rank)
        return out

    def dense(self, ctx, flat):
        """The uncompressed average: g/n, all-reduced (warm-up steps, 1-D tensors)."""
        flat *= 1.0 / ctx.size
        return all_reduce(ctx, flat, algorithm=self.algorithm)

    def reduce(self, ctx, flat, index):
        raise NotImplementedError

    def pop_stats(self):
        """This rank's bytes since the last call (one step, if called once per step):
        ``wire_bytes`` (counted by the transport), ``dense_bytes`` (what the ring
        all-reduce of the same buckets sends) and their ratio."""
        with self._lock:
            wire, dense, self._wire, self._dense = self._wire, self._dense, 0, 0
        return {"wire_bytes": wire, "dense_bytes": dense,
                "compression_ratio": dense / wire if wire else 1.0}

    # ------------------------------------------------------------------ error feedback
    @staticmethod
    def work_dtype(flat):
        """Compute and keep residuals in fp32 when the buckets travel in half."""
        return xp.float32 if is_half(flat.dtype) else flat.dtype

    def corrected(self, flat, index):
        """g + e: the gradient plus what earlier steps did not send (a new array)."""
        x = flat.astype(self.work_dtype(flat), copy=True)
        e = self.residual.get(index)
        if e is not None:
            x += e
        return x

    def keep(self, index, e):
        """Store the new residual e = (g + e) − C(g + e).  A non-finite one (an fp16
        overflow step) is dropped rather than carried into every later step."""
        self.residual[index] = e if bool(xp.isfinite(e).all()) else xp.zeros_like(e)

    def residual_norm(self):
        """‖e‖ over all buckets of this rank (the lesson plots it over steps)."""
        return float(sum(float((e.astype(xp.float64) ** 2).sum()) for e in self.residual.values())) ** 0.5

    # ------------------------------------------------------------------ checkpoints
    def per_param(self, index, flat):
        """{name: array shaped like the parameter} of a bucket-shaped flat array."""
        out = {}
        for name, off, shape in zip(self.names[index], self.buckets[index].offsets,
                                    self.buckets[index].shapes):
            size = 1
            for s in shape:
                size *= s
            out[name] = to_host(flat[off:off + size]).reshape(shape).copy()
        return out

    def state_dict(self):
        """This rank's state as {key: numpy array}: ``step``, ``residual.<param name>``
        (error feedback; differs per rank) and whatever the method adds."""
        import numpy as np  # host arrays for the checkpoint
        state = {"step": np.array(self.step, dtype=np.int64)}
        for index, e in sorted(self.residual.items()):
            for name, a in self.per_param(index, e).items():
                state[f"residual.{name}"] = a
        state.update(self.extra_state())
        return state

    def extra_state(self):
        return {}

    def load_state_dict(self, state):
        """Restore ``state_dict()``'s output (the hook must be bound to the same model)."""
        if self.buckets is None:
            raise RuntimeError("bind the hook to its synchroniser before loading its state")
        state = dict(state)
        self.step = int(state.pop("step"))
        self._called.clear()
        self.residual = {}
        for index, bucket in enumerate(self.buckets):
            keys = [f"residual.{n}" for n in self.names[index]]
            if not any(k in state for k in keys):
                continue
            dtype = xp.float32 if is_half(bucket.dtype) else bucket.dtype
            e = xp.zeros(bucket.padded, dtype=dtype)
            for key, off, shape in zip(keys, bucket.offsets, bucket.shapes):
                a = state.pop(key, None)
                if a is not None:
                    e[off:off + a.size] = to_device(a, dtype=dtype).reshape(-1)
            self.residual[index] = e
        self.load_extra_state(state)
        if state:
            raise KeyError(f"{self.name} hook: unexpected state {sorted(state)[:4]} "
                           "(a checkpoint of another method or model?)")

    def load_extra_state(self, state):
        """Pop the method's own keys from ``state``."""
