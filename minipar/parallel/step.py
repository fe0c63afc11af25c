"""The one optimizer step, for every gradient synchroniser and every precision.

    slots = sync.finish()                 this rank's (master, averaged gradient) pairs
    sum partial gradients over tp         sequence parallelism: replicated weights saw
                                          only this rank's tokens, dW = Σ_tp dW_r
    unscale: g /= S                       fp16: the loss was multiplied by S
    found_inf and ||g||² = Σ_groups Σ w·g²
                                          each element counted once over dp, tp and pp;
                                          under fp16 ONE all-reduce over every rank
                                          carries both, [Σ w·g²/copies, flag], so any
                                          non-finite g anywhere -> every rank skips
                                          (``parallel/norm.py``).  Both stay on the
                                          device and are read together, with the loss for
                                          the log: one device->host wait per step; on a
                                          GPU with every master gradient in one buffer,
                                          unscale, flag and squares are one kernel launch
    clip: g *= max_norm / ||g||           when ||g|| > max_norm
    AdamW on each slot                    ``optim.adamw_update``, m and v held here
    sync.publish()                        the model's weights from the updated masters

Everything here is written once: DDP or ZeRO-1/2/3, fp32/fp64 or fp16/bf16, with or
without tensor and pipeline parallelism.  Only the synchroniser differs, and it keeps
the contract of ``parallel.sync``.
"""
from __future__ import annotations

import math

from minipar.autograd.ops_math import fused_kernels
from minipar.backend import xp, to_host
from minipar.comm import all_reduce
from minipar.optim import adamw_update
from minipar.parallel.norm import GlobalNorm


def sum_partial_over_tp(slots, tp_comm):
    """g[mask] = Σ_tp g[mask] for every slot's tp-partial elements, in one all-reduce."""
    parts = [(s, s.tp_replicated) for s in slots
             if s.grad is not None and s.tp_replicated is not False]
    if not parts or tp_comm is None or tp_comm.size == 1:
        return
    pick = lambda s, m: s.grad.reshape(-1) if m is True else s.grad[m]  # noqa: E731
    flat = xp.concatenate([pick(s, m) for s, m in parts])
    all_reduce(tp_comm, flat)
    start = 0
    for s, m in parts:
        n = s.grad.size if m is True else int(m.sum())
        if m is True:
            s.grad[...] = flat[start:start + n].reshape(s.grad.shape)
        else:
            s.grad[m] = flat[start:start + n]
        start += n


class Optimizer:
    """AdamW over a synchroniser's slots, with loss scaling and global-norm clipping.

    ``norm_comms``: the model's groups that hold other parts of the gradient (tp, pp);
    the synchroniser adds its own (ZeRO: dp).  ``tp_comm``: where sequence-parallel
    partial gradients are summed.  ``scaler``: an ``amp.DynamicLossScaler`` (fp16), or
    None.  ``step(max_norm)`` returns the norm before clipping, None for a skipped step
    (fp16 overflow); a non-finite norm outside fp16's skipping raises FloatingPointError
    on every rank before anything is updated.
    """

    def __init__(self, sync, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 scaler=None, norm_comms=(), tp_comm=None):
        self.sync, self.scaler, self.tp_comm = sync, scaler, tp_comm
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        # under fp16 the norm's all-reduce also agrees the overflow flag over every rank
        world = scaler.comm if scaler is not None and scaler.enabled else None
        self.norm = GlobalNorm(list(sync.norm_comms) + list(norm_comms), world=world)
        self.step_count = 0
        self.m = [xp.zeros_like(s.master) for s in sync.slots]
        self.v = [xp.zeros_like(s.master) for s in sync.slots]
        self.decay = [_decay_of(s, weight_decay) for s in sync.slots]
        self.last_scale = scaler.scale if scaler else 1.0
        self.last_skipped = False
        self.read_along = None       # the host values of ``step(read_along=...)``

    def scale_loss(self, loss):
        return self.scaler.scale_loss(loss) if self.scaler else loss

    @property
    def loss_scale(self):
        return self.scaler.scale if self.scaler else 1.0

    def no_sync(self):
        return self.sync.no_sync()

    def step(self, max_norm=None, read_along=None):
        """``read_along``: a device array (e.g. the step's loss) to bring to the host in the
        step's one device->host read; its values are then ``self.read_along``."""
        slots = self.sync.finish()
        sum_partial_over_tp(slots, self.tp_comm)
        scaling = self.scaler is not None and self.scaler.enabled
        if scaling:
            self.last_scale = self.scaler.scale
        # [||g||², flag] on the device, agreed by all ranks; then the step's one device->host
        # read: the skip decision, ||g||² and what rides along
        agreed = self._square_and_check(slots, scaling)
        parts = [agreed] + ([] if read_along is None else
                            [xp.asarray(read_along, dtype=xp.float64).reshape(-1)])
        host = to_host(xp.concatenate(parts))
        self.read_along = None if read_along is None else host[2:]
        self.last_skipped = bool(host[1] > 0)
        if scaling:
            self.scaler.update(self.last_skipped)
            if self.last_skipped:
                self.sync.zero_grad()
                return None
        norm = math.sqrt(float(host[0]))
        if not math.isfinite(norm):     # the same on every rank: all stop, nothing updated
            self.sync.zero_grad()
            raise FloatingPointError(f"the gradient norm is {norm}")
        clip = max_norm / (norm + 1e-6) if max_norm and norm > max_norm else 1.0
        self.step_count += 1
        b1, b2 = self.betas
        for s, m, v, decay in zip(slots, self.m, self.v, self.decay):
            if s.grad is None:
                continue
            if clip != 1.0:
                s.grad *= clip
            adamw_update(s.master, s.grad, m, v, self.step_count, self.lr, b1, b2, self.eps, decay)
        self.sync.publish()
        self.sync.zero_grad()
        return norm

    def _square_and_check(self, slots, scaling):
        """[||g||², overflow flag] as a float64 device array, summed over the norm's groups
        and the flag agreed over every rank (``GlobalNorm.summed_with_flag``: one
        all-reduce), unscaled first when ``scaling`` (else the flag is 0).  Where the
        synchroniser holds every gradient in one buffer and a kernel takes it, one launch
        does unscale, check and squares (``kernels/fused_cuda.unscale_check_norm``); else a
        pass per gradient, the squares summed in float64."""
        flat = self.sync.flat_grads()
        fused = fused_kernels("unscale_check_norm", flat[0]) if flat is not None else None
        if fused is not None:
            buffer, ends, weights = flat
            flag, squares = xp.zeros(1, dtype=xp.float32), xp.zeros(1, dtype=xp.float32)
            fused.unscale_check_norm(buffer, ends, weights, 1.0 / self.scaler.scale if scaling else 1.0,
                                     flag, squares)
        else:
            flag = self.scaler.unscale_and_check([s.grad for s in slots]) if scaling else None
            squares = self.norm.local_sq_of_slots(slots)
        if not scaling:     # bf16, fp32: nothing is skipped (a non-finite norm stops the run)
            flag = xp.zeros(1, dtype=xp.float32)
        return self.norm.summed_with_flag(squares, flag)

    def zero_grad(self):
        self.sync.zero_grad()

    @property
    def exposed_comm_s(self):
        return self.sync.exposed_comm_s

    # ------------------------------------------------------------ accounting, checkpoints
    def memory_bytes(self):
        mem = dict(self.sync.memory_bytes())
        mem["optimizer"] += sum(m.nbytes + v.nbytes for m, v in zip(self.m, self.v))
        return mem

    def model_state_dict(self):
        """The masters by parameter name (fp32 under mixed precision).  Collective."""
        return self.sync.to_named([s.master for s in self.sync.slots])

    def state_dict(self):
        """Full (unsharded) m and v by parameter name: a layout-free checkpoint.  Collective."""
        return {"step": self.step_count, "m": self.sync.to_named(self.m),
                "v": self.sync.to_named(self.v)}

    def load_state_dict(self, state):
        self.step_count = int(state["step"])
        for mine, theirs in ((self.m, state["m"]), (self.v, state["v"])):
            for a, b in zip(mine, self.sync.from_named(theirs)):
                a[...] = b


def _decay_of(slot, weight_decay):
    """λ·mask for the slot.  A per-element mask (a flat bucket or shard, as large as the
    weights) is scaled in place: the optimizer owns its synchroniser's slots, and a
    second array as large as the model would be memory the process holds for nothing."""
    if getattr(slot.decay, "ndim", 0):
        if slot.decay_scale is None:            # a second optimizer must not scale it again
            slot.decay *= weight_decay
            slot.decay_scale = weight_decay
        elif slot.decay_scale != weight_decay:
            raise ValueError(f"these slots' decay mask is already scaled by weight decay "
                             f"{slot.decay_scale}, not {weight_decay}: build a new synchroniser")
        return slot.decay
    return slot.decay * weight_decay

