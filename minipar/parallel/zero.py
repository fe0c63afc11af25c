"""ZeRO: shard what data parallelism replicates (Rajbhandari et al., 2020).

Plain data parallelism keeps, on every one of N replicas, all Ψ parameters, their
gradients and the optimizer state: 16Ψ bytes for fp32 AdamW (4 params + 4 grads +
8 for m and v).  ZeRO gives each rank a 1/N shard of each bucket (``buckets.py``)
and keeps only what it needs:

    stage 1  optimizer state sharded            4Ψ + 4Ψ + 8Ψ/N   = 8Ψ + 8Ψ/N
    stage 2  + gradients sharded                4Ψ + (4Ψ + 8Ψ)/N = 4Ψ + 12Ψ/N
    stage 3  + parameters sharded               (4Ψ + 4Ψ + 8Ψ)/N = 16Ψ/N

Stage 1: after backward, each bucket's gradients are reduce-scattered (a rank
receives the sum of its shard only), the rank updates its shard of the
parameters with its shard of m and v, and the updated shards are all-gathered.
Reduce-scatter + all-gather move the same bytes as one all-reduce, so stage 1
and 2 cost no more communication than data parallelism.

Stage 2: the reduce-scatter of a bucket starts from the gradient hooks as soon
as the bucket is complete, and the full gradients are freed at once: a rank
never holds more than one bucket of full gradients beyond its shard.

Stage 3 (``zero3.py``) also shards the parameters themselves.

The update is AdamW applied elementwise to the shard (``optim.adamw_update``),
so it equals the unsharded update; gradient clipping uses the norm of the full
gradient: ||g||² = Σ over ranks of ||my shard||² (one tiny all-reduce).
"""
from __future__ import annotations

import time

from minipar.backend import xp, memory, to_host, to_device
from minipar.comm import all_gather, all_reduce, reduce_scatter_async, reduce_scatter
from minipar.optim import adamw_update, decays
from minipar.parallel.buckets import make_buckets
from minipar.parallel.data import broadcast_parameters


class ZeroOptimizer:
    """AdamW with ZeRO stage 1 or 2 over ``comm`` (the data-parallel group)."""

    ddp = None   # no DataParallel wrapper: gradients reach the shards through this class

    def __init__(self, module, comm, stage=1, lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                 weight_decay=0.1, bucket_bytes=25 * 2**20, buckets=None, global_norm=None,
                 prepare_grads=None, half_dtype=None, scaler=None):
        """``half_dtype`` (fp16/bf16): the model computes in half precision while the
        shards, and only the shards, are fp32 masters; ``scaler`` is then the loss
        scaler (its found-inf verdict agreed over every rank)."""
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage}")
        self.module, self.comm, self.stage = module, comm, stage
        from minipar.parallel.norm import GlobalNorm
        self.global_norm = global_norm or GlobalNorm()   # other groups' parts (pp, tp)
        self.prepare_grads = prepare_grads               # before the sync (tp replicas)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.step_count = 0
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = {id(p): n for n, p in named}
        self.params = [p for _, p in named]
        broadcast_parameters(self.params, comm)
        self.buckets = buckets or make_buckets(self.params, bucket_bytes, pad_to=comm.size)
        self.half_dtype, self.scaler = half_dtype, scaler
        self.last_scale, self.last_skipped = (scaler.scale if scaler else 1.0), False
        self.bucket_of = {}
        for b in self.buckets:
            lo, hi = b.shard_range(comm.rank)
            flat = b.pack_data()                     # fp32 (or fp64) weights, padded
            b.decay = self._mask(b, lambda n, p: self.weight_decay if decays(n, p) else 0.0)[lo:hi].copy()
            b.norm_weight = self._mask(b, lambda n, p: self.global_norm.weight(n))[lo:hi].copy()
            if half_dtype is not None:               # fp32 master shard; the model in half
                b.param_shard = flat[lo:hi].copy()
                flat = flat.astype(half_dtype)
                b.dtype = flat.dtype
            b.flat = flat if stage < 3 else None
            if stage < 3:                            # parameters become views of the flat
                for p, view in b.views(flat):        # storage, so my shard is a view too
                    p.data = memory.track(view)
            if half_dtype is None:
                b.param_shard = flat[lo:hi] if stage < 3 else flat[lo:hi].copy()
            elif stage == 3:                         # what is gathered: my shard in half
                b.half_shard = b.param_shard.astype(half_dtype)
            b.m = xp.zeros_like(b.param_shard)
            b.v = xp.zeros_like(b.param_shard)
            b.grad_shard = None
            for p in b.params:
                self.bucket_of[id(p)] = b
                if stage == 2:
                    p.register_hook(self._grad_ready)
        self.exposed_comm_s = 0.0

    def scale_loss(self, loss):
        return self.scaler.scale_loss(loss) if self.scaler else loss

    def gather_source(self, bucket):
        """What the weights are all-gathered from: my shard, rounded to half if the
        model computes in half precision."""
        if self.half_dtype is None:
            return bucket.param_shard
        if self.stage == 3:
            return bucket.half_shard
        return bucket.param_shard.astype(self.half_dtype)

    def _mask(self, bucket, value_of):
        """A flat per-element array over the bucket: value_of(name, param) on each param."""
        mask = xp.zeros(bucket.padded, dtype=bucket.params[0].dtype)
        for p, view in bucket.views(mask):
            view[...] = value_of(self.names[id(p)], p)
        return mask

    # ------------------------------------------------------------ gradients
    def _grad_ready(self, param):
        bucket = self.bucket_of[id(param)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._reduce_scatter(bucket, asynchronous=True)

    def _reduce_scatter(self, bucket, asynchronous):
        flat = bucket.pack_grads()
        for p in bucket.params:       # the full gradients are not kept (stage 2's saving)
            p.grad = None
        flat *= 1.0 / self.comm.size
        bucket.ready = 0
        if asynchronous:
            bucket.pending = getattr(bucket, "pending", []) + [reduce_scatter_async(self.comm, flat)]
        else:
            self._add_to_shard(bucket, reduce_scatter(self.comm, flat))

    def _add_to_shard(self, bucket, shard):
        if bucket.grad_shard is None:
            bucket.grad_shard = shard.copy()
        else:
            bucket.grad_shard += shard

    def finish_gradient_sync(self):
        """Complete every bucket's reduce-scatter; returns seconds spent waiting."""
        start = time.perf_counter()
        for bucket in self.buckets:
            if self.stage == 1:
                self._reduce_scatter(bucket, asynchronous=False)
            for handle in getattr(bucket, "pending", []):
                self._add_to_shard(bucket, handle.wait())
            bucket.pending = []
        self.exposed_comm_s = time.perf_counter() - start
        return self.exposed_comm_s

    # ------------------------------------------------------------ update
    def grad_norm(self, grads):
        """||g|| of the full averaged gradient, from every rank's shards ``grads``."""
        local = sum(float((b.norm_weight * g.astype(xp.float64) ** 2).sum())
                    for b, g in zip(self.buckets, grads))
        total = all_reduce(self.comm, xp.asarray([local], dtype=xp.float64))
        return self.global_norm.total(float(to_host(total)[0]))

    def step(self, max_norm=None):
        """Clip by the global norm, AdamW on my shards, all-gather the weights.
        Returns the gradient norm before clipping (None for a step skipped on overflow)."""
        if self.prepare_grads:
            self.prepare_grads()
        self.finish_gradient_sync()
        grads = [xp.zeros_like(b.param_shard) if b.grad_shard is None
                 else b.grad_shard.astype(b.param_shard.dtype, copy=False) for b in self.buckets]
        for b in self.buckets:
            b.grad_shard = None
        if self.scaler is not None:                  # mixed precision: unscale, agree, maybe skip
            self.last_scale = self.scaler.scale
            self.scaler.unscale_(grads)
            self.last_skipped = self.scaler.found_inf(grads)
            self.scaler.update(self.last_skipped)
            if self.last_skipped:
                return None
        norm = self.grad_norm(grads)
        scale = max_norm / (norm + 1e-6) if max_norm and norm > max_norm else 1.0
        self.step_count += 1
        for b, g in zip(self.buckets, grads):
            if scale != 1.0:
                g *= scale
            adamw_update(b.param_shard, g, b.m, b.v, self.step_count, self.lr,
                         self.betas[0], self.betas[1], self.eps, b.decay)
            self._publish(b)
        return norm

    def _publish(self, bucket):
        """Stages 1-2 keep full weights: all-gather the updated shards into the flat
        storage the parameters are views of."""
        all_gather(self.comm, self.gather_source(bucket),
                   sizes=[bucket.shard_size] * self.comm.size, out=bucket.flat)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    # ------------------------------------------------------------ accounting, checkpoints
    def memory_bytes(self):
        """Bytes this rank holds for parameters, gradients and optimizer state (the fp32
        master shard, under mixed precision, counts as optimizer state, as in the paper)."""
        item = self.buckets[0].dtype.itemsize     # of the weights the model computes with
        if self.stage < 3:
            params = sum(b.flat.nbytes for b in self.buckets)
        else:
            params = sum(b.shard_size * item for b in self.buckets)
        if self.stage == 1:
            grads = sum(p.size * item for p in self.params)   # full grads live in backward
        else:
            grads = sum(b.shard_size * item for b in self.buckets)
        states = sum(b.m.nbytes + b.v.nbytes for b in self.buckets)
        if self.half_dtype is not None:
            states += sum(b.param_shard.nbytes for b in self.buckets)
        return {"params": params, "grads": grads, "optimizer": states}

    def model_state_dict(self):
        """Full weights by name, gathered from the shards (fp32 masters under mixed
        precision).  Collective."""
        return self._gather_by_name("param_shard")

    def _gather_by_name(self, attr):
        out = {}
        for b in self.buckets:
            full = all_gather(self.comm, getattr(b, attr), sizes=[b.shard_size] * self.comm.size)
            for p, view in b.views(full):
                out[self.names[id(p)]] = to_host(view).copy()
        return {name: out[name] for name in self.names.values() if name in out}

    def state_dict(self):
        """Full (unsharded) m and v by parameter name: a layout-independent checkpoint.
        Collective: every rank of the group must call it."""
        return {"step": self.step_count, "m": self._gather_by_name("m"),
                "v": self._gather_by_name("v")}

    def load_state_dict(self, state):
        self.step_count = int(state["step"])
        for b in self.buckets:
            lo, hi = b.shard_range(self.comm.rank)
            for attr in ("m", "v"):
                flat = xp.zeros(b.padded, dtype=b.m.dtype)
                for p, view in b.views(flat):
                    view[...] = to_device(state[attr][self.names[id(p)]])
                getattr(b, attr)[...] = flat[lo:hi]
        # the weights themselves were loaded into the model before this optimizer sharded them
