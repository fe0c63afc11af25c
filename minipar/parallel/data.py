"""Data parallelism in the manner of PyTorch's DistributedDataParallel.

Every replica holds the whole model and a 1/dp share of the global batch.  If
each computes the mean loss of its share, the mean over replicas of their
gradients is the gradient of the global-batch loss:

    g = (1/dp) · Σ_r g_r        (one all-reduce, then a division)

so after the all-reduce every replica makes the same update as one process on
the whole batch.  To hide the all-reduce behind backward, gradients are packed
into buckets (``buckets.py``); a leaf hook counts the gradients arriving in each
bucket, and the moment a bucket is complete its all-reduce is started on the
communication thread, while backward goes on computing earlier layers.
``finish_gradient_sync()`` waits for what is still in flight and writes the
averaged gradients back.

``no_sync()`` skips communication for gradient accumulation: K-1 micro-batches
accumulate locally, the K-th triggers the buckets with the summed gradients.
"""
from __future__ import annotations

import contextlib
import sys
import time

from minipar.comm import all_reduce, all_reduce_async, broadcast
from minipar.parallel.buckets import make_buckets


def broadcast_parameters(params, comm, root=0):
    """Make every replica start from root's weights (one flat broadcast per dtype)."""
    if comm.size == 1:
        return
    for bucket in make_buckets(params, bucket_bytes=float("inf")):
        flat = bucket.pack_data()
        broadcast(comm, flat, root=root)
        for p, view in bucket.views(flat):
            p.data[...] = view


class DataParallel:
    def __init__(self, module, comm, bucket_bytes=25 * 2**20, algorithm="auto", overlap=True):
        self.module = module
        self.comm = comm
        self.algorithm = algorithm
        self.overlap = overlap
        self.params = [p for p in module.parameters() if p.requires_grad]
        broadcast_parameters(self.params, comm)
        self.buckets = make_buckets(self.params, bucket_bytes)
        self.bucket_of = {}
        for bucket in self.buckets:
            for p in bucket.params:
                self.bucket_of[id(p)] = bucket
                p.register_hook(self._grad_ready)
        self.sync = True
        self.exposed_comm_s = 0.0    # time spent waiting for communication in the last step
        self.events = []             # (bucket index, submitted, started, finished) of the last sync
        self._saved_switch = None

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def parameters(self):
        return self.module.parameters()

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

    # While an all-reduce runs on the communication thread, the main thread is busy in
    # backward and holds Python's GIL; the thread needs it between two messages of the
    # ring and by default waits up to 5 ms for it.  A shorter switch interval while
    # buckets are in flight lets the thread move on after each message.
    SWITCH_INTERVAL_S = 1e-4

    def _launch(self, bucket):
        if self._saved_switch is None:
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(self.SWITCH_INTERVAL_S)
        flat = bucket.pack_grads()
        flat *= 1.0 / self.comm.size
        bucket.submitted = time.perf_counter()
        bucket.handle = all_reduce_async(self.comm, flat, algorithm=self.algorithm)
        bucket.flat = flat

    def finish_gradient_sync(self):
        """Wait for (or, without overlap, run) every bucket's all-reduce; write back
        the averaged gradients.  Returns the seconds spent waiting (exposed comm)."""
        if self.comm.size == 1:
            return 0.0
        start = time.perf_counter()
        self.events = []
        for i, bucket in enumerate(self.buckets):
            if bucket.handle is None:          # not launched: no overlap, or unused params
                t0 = time.perf_counter()
                flat = bucket.pack_grads()
                flat *= 1.0 / self.comm.size
                all_reduce(self.comm, flat, algorithm=self.algorithm)
                self.events.append((i, t0, t0, time.perf_counter()))
            else:
                flat = bucket.handle.wait()
                h = bucket.handle
                self.events.append((i, bucket.submitted, h.started_at, h.finished_at))
            for p, view in bucket.views(flat):
                p.grad = view
            bucket.handle, bucket.ready = None, 0
            bucket.flat = None
        if self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None
        self.exposed_comm_s = time.perf_counter() - start
        return self.exposed_comm_s


class DataParallelAdamW:
    """ZeRO stage 0: replicated AdamW behind a DataParallel wrapper.

    Same interface as ``ZeroOptimizer`` (``step(max_norm)``, ``state_dict``,
    ``memory_bytes``), so the training loop treats every stage alike."""

    stage = 0
    scaler = None    # no loss scaling in fp32/fp64 (mixed precision: amp.AmpAdamW)

    def __init__(self, ddp, global_norm=None, prepare_grads=None, **adam):
        """``global_norm``: a ``norm.GlobalNorm`` when other ranks hold other parts of
        the model; ``prepare_grads``: called after the dp sync, before clipping (tensor
        parallelism sums replicated gradients there)."""
        from minipar.optim import AdamW
        from minipar.parallel.norm import GlobalNorm
        self.ddp = ddp
        self.global_norm = global_norm or GlobalNorm()
        self.prepare_grads = prepare_grads
        self.adam = AdamW(ddp.module.named_parameters(), **adam)

    lr = property(lambda self: self.adam.lr, lambda self, v: setattr(self.adam, "lr", v))

    def scale_loss(self, loss):
        return loss

    def step(self, max_norm=None):
        from minipar.optim import clip_grad_norm
        self.ddp.finish_gradient_sync()
        if self.prepare_grads:
            self.prepare_grads()
        named = ((name, p.grad) for name, p in self.adam.params)
        norm = self.global_norm.total(self.global_norm.local_sq(named))
        clip_grad_norm(self.ddp.params, max_norm, norm=norm)
        self.adam.step()
        return norm

    def zero_grad(self):
        self.adam.zero_grad()

    @property
    def exposed_comm_s(self):
        return self.ddp.exposed_comm_s

    def memory_bytes(self):
        params = sum(p.data.nbytes for p in self.ddp.params)
        states = sum(s["m"].nbytes + s["v"].nbytes for s in self.adam.state.values())
        return {"params": params, "grads": params, "optimizer": states}

    def model_state_dict(self):
        return self.ddp.module.state_dict()

    def state_dict(self):
        return self.adam.state_dict()

    def load_state_dict(self, state):
        self.adam.load_state_dict(state)
