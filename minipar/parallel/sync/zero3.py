"""ZeRO stage 3: the parameters themselves are sharded too (16Ψ/N bytes per rank).

Each *unit* — the embeddings, each transformer block, the final norm and head —
is one flat bucket of which a rank keeps only its 1/N shard.  Its full weights
exist only while the unit computes:

    forward   all-gather unit i (prefetch i+1), run it, free it
    backward  when the gradient reaches the unit's output: all-gather it again
              (prefetch i-1); when it has left through the unit's input:
              reduce-scatter the unit's gradients, free weights and full grads

``Zero3Model`` wraps the (unmodified) model and runs its parts unit by unit; two
autograd Functions mark the boundaries, so backward itself says when a unit starts
and ends: ``_UnitExit`` (identity; its backward runs first, re-gathers) and
``_UnitEntry`` (identity; its backward runs after every op of the unit).  Ops read
their weight from the parameter at backward time (``ctx.input_value``), so the
re-gathered storage is what they see — and a recomputed block (``Recompute``) re-runs
inside the gathered unit.  The update is ZeRO-1/2's on the shards, and ``publish``
gathers nothing: the next forward does.

Two units are gathered at a time (the one computing, the prefetched one) and two
reduce-scatters may be in flight, so the full-size arrays live in four buffers made
once, each as large as the largest unit: unit i is gathered into ``gathered[i % 2]``
and its gradients accumulate straight into ``staging[i % 2]`` (each ``p.grad`` a view
of it, set when backward reaches the unit), which its reduce-scatter then uses in
place.  Neighbouring units alternate, and before unit i's gradients take a staging
buffer, the reduce-scatter of unit i + 2 that last used it is waited for.  Buffers made
once are what FSDP and DeepSpeed do too: allocating and freeing a unit-sized array per
unit leaves the allocator holding freed memory it cannot reuse (measured: ~70 MiB of
extra peak per rank on the gpt2 preset at dp4, beyond the two units themselves).
"""
from __future__ import annotations

from minipar.backend import xp
from minipar.autograd import Function, Tensor, is_grad_enabled
from minipar.comm import all_gather, all_gather_async
from minipar.nn.module import Wrapper
from minipar.parallel.buckets import Bucket
from minipar.parallel.sync.zero import Shard, ZeroSync


class _UnitBoundary(Function):
    """Identity forward; its backward tells the owner that backward crossed a unit's edge."""

    @staticmethod
    def forward(ctx, x, owner, index):
        ctx.owner, ctx.index = owner, index
        return x


class _UnitExit(_UnitBoundary):
    @staticmethod
    def backward(ctx, g):
        ctx.owner.gather(ctx.index)
        ctx.owner.stage_grads(ctx.index)
        ctx.owner.prefetch(ctx.index - 1)
        return g, None, None


class _UnitEntry(_UnitBoundary):
    @staticmethod
    def backward(ctx, g):
        ctx.owner.release_unit(ctx.index)
        return g, None, None


def model_units(model):
    """The parameter lists of the units, in forward order."""
    head = model.ln_f.parameters() + ([model.lm_head.weight] if model.lm_head else [])
    embed = [model.wte.weight] + ([model.wpe.weight] if model.wpe is not None else [])
    return [embed, *[b.parameters() for b in model.blocks], head]


class Zero3Sync(ZeroSync):
    shards_weights = True

    def __init__(self, model, comm, table=None, half_dtype=None, initial_piece=None,
                 units=None, mean_over=None):
        """``initial_piece(name)``: the values of a parameter that is still a placeholder
        (``nn/init.py``); only my range of each unit is kept, one tensor at a time.
        ``units``: the parameter lists to shard, in forward order (default
        ``model_units(model)``); ``model`` then holds exactly their parameters."""
        if model.config.tie_weights:
            raise ValueError("ZeRO-3 does not support tied weights (the tied weight would "
                             "belong to two units); untie them")
        units = model_units(model) if units is None else units
        buckets = [Bucket(u, pad_to=comm.size, dtype=half_dtype) for u in units]
        self.full = [None] * len(buckets)     # unit i's gathered flat weights while it computes
        self.staged = [None] * len(buckets)   # (flat, views) while its gradients accumulate
        super().__init__(model, comm, table, stage=3, buckets=buckets, half_dtype=half_dtype,
                         initial_piece=initial_piece, mean_over=mean_over)
        self.handles = {}
        self.empty = xp.zeros(0, dtype=buckets[0].dtype)   # what a freed parameter holds
        largest = max(b.padded for b in buckets)
        self.gathered = _Pair(largest)    # the full weights of units i and i ± 1
        self.staging = _Pair(largest)     # their full gradients, reduce-scattered in place
        self.staging_busy = [None, None]  # the reduce-scatter using each staging buffer
        for i in range(len(buckets)):
            self.free(i)

    def _hold(self, b, lo, hi):
        """Only my range of the unit is ever built (sharded construction): the master
        shard, and under mixed precision its copy in the model's dtype, gathered."""
        master_dtype = xp.float32 if self.half_dtype is not None else None
        master = b.pack_range(lo, hi, self.value_of, master_dtype)
        half = master.astype(self.half_dtype) if self.half_dtype is not None else None
        return Shard(master, half=half, pending=[])

    def gather_source(self, i):
        state = self.shards[i]
        return state.master if state.half is None else state.half

    def wrap(self, model):
        """The model as it must be called: unit by unit."""
        return Zero3Model(model, self)

    # ------------------------------------------------------------ gather / free
    def _sizes(self, b):
        return [b.shard_size] * self.comm.size

    def _gather_buffer(self, i):
        """Where unit i is gathered: ``gathered[i % 2]``, or a fresh array should the unit
        last there still be held (not in a forward/backward walk's unit order)."""
        b = self.buckets[i]
        holder = self.gathered.holder[i % 2]
        busy = holder is not None and holder != i and (self.full[holder] is not None
                                                       or holder in self.handles)
        return xp.empty(b.padded, dtype=b.dtype) if busy else self.gathered.take(i, b)

    def prefetch(self, i):
        if 0 <= i < len(self.buckets) and i not in self.handles and self.full[i] is None:
            b = self.buckets[i]
            self.handles[i] = all_gather_async(self.comm, self.gather_source(i), sizes=self._sizes(b),
                                               out=self._gather_buffer(i))

    def gather(self, i):
        b = self.buckets[i]
        if self.full[i] is not None:
            return
        handle = self.handles.pop(i, None)
        self.full[i] = handle.wait() if handle else all_gather(self.comm, self.gather_source(i),
                                                               sizes=self._sizes(b),
                                                               out=self._gather_buffer(i))
        for p, view in b.views(self.full[i]):
            p.data = view

    def stage_grads(self, i):
        """Backward reached unit i: its gradients accumulate into ``staging[i % 2]``, once
        the reduce-scatter that last used that buffer is done."""
        b = self.buckets[i]
        holder = self.staging.holder[i % 2]
        if (any(p.grad is not None for p in b.params)     # already staged, or accumulating
                or holder is not None and self.staged[holder] is not None):
            return                        # (then its gradients are packed as ZeRO-2's are)
        previous = self.staging_busy[i % 2]
        if previous is not None:
            previous.wait()
            self.staging_busy[i % 2] = None
        flat = self.staging.take(i, b)
        flat.fill(0)
        self.staged[i] = (flat, [view for _, view in b.views(flat)])
        for p, view in zip(b.params, self.staged[i][1]):
            p.grad = view

    def _grad_buffer(self, i):
        """The unit's staged gradients, any ``p.grad`` that was replaced copied back in."""
        if self.staged[i] is None:
            return super()._grad_buffer(i)
        (flat, views), self.staged[i] = self.staged[i], None
        for p, view in zip(self.buckets[i].params, views):
            if p.grad is not view:
                view[...] = 0 if p.grad is None else p.grad
        return flat

    def free(self, i):
        self.full[i] = None
        for p in self.buckets[i].params:
            p.data = self.empty

    def release_unit(self, i):
        """The unit's backward is over: hand its gradients to the reduce-scatter, free it."""
        b = self.buckets[i]
        if any(p.grad is not None for p in b.params):
            self._reduce_scatter(i, asynchronous=True)   # ZeRO-2's: frees the full grads
            self.staging_busy[i % 2] = self.shards[i].pending[-1]
        self.free(i)

    def run_unit(self, i, fn, x):
        """fn(x) with unit i's weights gathered, its edges marked for backward."""
        self.gather(i)
        self.prefetch(i + 1)
        tracked = is_grad_enabled() and isinstance(x, Tensor) and x.requires_grad
        out = fn(_UnitEntry.apply(x, self, i) if tracked else x)
        if is_grad_enabled() and out.requires_grad:
            out = _UnitExit.apply(out, self, i)
        self.free(i)
        return out

    # ------------------------------------------------------------ the ZeRO-1/2 machinery
    def finish(self):
        for i in range(len(self.buckets)):   # units no backward left (the embeddings: ids
            self.release_unit(i)             # need no gradient, so no _UnitEntry ran)
        for h in self.handles.values():      # prefetches nobody used
            h.wait()
        self.handles.clear()
        self.staging_busy = [None, None]     # finish waits for every reduce-scatter
        return super().finish()

    def in_flight(self):
        """The units' reduce-scatters and the all-gathers prefetched, not yet waited for."""
        return super().in_flight() + list(self.handles.values())

    def publish(self):
        """Weights stay sharded (the next forward gathers them); under mixed precision
        the half copy of my shard is refreshed from the fp32 master shard."""
        for state in self.shards:
            if state.half is not None:
                state.half[...] = state.master

    def memory_bytes(self):
        """My shard of every unit's weights and gradients (the full ones live only while a
        unit computes), and the fp32 master shard under mixed precision."""
        item = self.buckets[0].dtype.itemsize     # of the weights the model computes with
        shards = sum(b.shard_size * item for b in self.buckets)
        masters = sum(state.master.nbytes for state in self.shards) if self.half_dtype else 0
        return {"params": shards, "grads": shards, "optimizer": masters}


class _Pair:
    """Two flat buffers of ``size`` elements, made on first use; ``take(i, bucket)`` is
    buffer i % 2's first ``bucket.padded`` elements, in the bucket's dtype."""

    def __init__(self, size):
        self.size, self.arrays, self.holder = size, [None, None], [None, None]

    def take(self, i, bucket):
        k = i % 2
        if self.arrays[k] is None or self.arrays[k].dtype != bucket.dtype:
            self.arrays[k] = xp.empty(self.size, dtype=bucket.dtype)
        self.holder[k] = i
        return self.arrays[k][:bucket.padded]


class Zero3Model(Wrapper):
    """A GPT (plain or tensor-parallel) run unit by unit under ZeRO-3:
    embed -> blocks -> head, each inside ``Zero3Sync.run_unit``."""

    def __init__(self, model, sync):
        super().__init__(model)
        self.sync = sync

    def forward(self, ids, targets=None):
        m, run = self.inner, self.sync.run_unit
        x = run(0, m.embed, ids)
        for i, block in enumerate(m.blocks):
            x = run(i + 1, block, x)
        logits = run(len(m.blocks) + 1, m.head, x)
        return logits if targets is None else (logits, m.loss(logits, targets))
