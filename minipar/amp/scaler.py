"""Dynamic loss scaling (see ``minipar.amp``): PyTorch's GradScaler rules plus
DeepSpeed's hysteresis and a floor, with the overflow verdict agreed across ranks.
"""
from __future__ import annotations

from minipar.autograd.ops_math import fused_kernels
from minipar.backend import xp, to_host


class DynamicLossScaler:
    """Loss scale S with growth, backoff, hysteresis and a floor.

    ``update(found_inf)`` after every step:
      overflow: ``skipped`` += 1, the clean-step counter restarts; if this is the
                ``hysteresis``-th overflow in a row (or later), S = max(S·backoff, min_scale);
      clean:    the overflow run is forgotten; after ``growth_interval`` clean steps
                in a row S = S·growth.
    ``enabled=False`` (bf16, fp32): S stays 1, nothing is checked, nothing is skipped.
    ``comm`` (a ``minipar.comm.Communicator`` over every rank of the grid) makes
    ``found_inf`` the same on all ranks, so no replica steps while another skips (the
    trainer's step agrees ``unscale_and_check``'s local flag over the same ranks itself,
    inside the gradient norm's one all-reduce).
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, hysteresis=2, min_scale=1.0, enabled=True, comm=None):
        if growth_factor <= 1 or not 0 < backoff_factor < 1:
            raise ValueError("need growth_factor > 1 and 0 < backoff_factor < 1")
        if growth_interval < 1 or hysteresis < 1 or min_scale <= 0:
            raise ValueError("need growth_interval >= 1, hysteresis >= 1, min_scale > 0")
        self.enabled, self.comm = enabled, comm
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval, self.hysteresis, self.min_scale = growth_interval, hysteresis, min_scale
        self.scale = float(max(init_scale, min_scale)) if enabled else 1.0
        self.skipped = 0             # steps skipped so far
        self.clean_steps = 0         # clean steps since the last overflow or growth
        self.overflows_left = hysteresis   # overflows still tolerated before a backoff

    def scale_loss(self, loss):
        """loss · S (a Tensor op, so backward carries S into every gradient)."""
        return loss * self.scale if self.enabled else loss

    def unscale_(self, grads):
        """g /= S in place, for each array (None skipped).  Do it before clipping."""
        if not self.enabled or self.scale == 1.0:
            return
        inv = 1.0 / self.scale
        for g in grads:
            if g is not None:
                g *= inv

    def found_inf(self, grads):
        """True if any gradient on ANY rank of ``comm`` holds inf or NaN (one host read)."""
        if not self.enabled:
            return False
        return bool(to_host(self.inf_flag(grads))[0] > 0)

    def unscale_and_check(self, grads):
        """``unscale_`` then this rank's own overflow flag [f], NOT yet agreed over ``comm``:
        the trainer's step agrees it in the all-reduce that sums the gradient norm
        (``parallel.norm.GlobalNorm.summed_with_flag``).  One pass per gradient where a
        fused kernel takes it (``kernels/fused_cuda.unscale_check``: g *= 1/S and the flag
        together); else the two array passes, with the same numbers."""
        inv = 1.0 / self.scale
        flag = xp.zeros(1, dtype=xp.float32)
        rest = []
        for g in grads:
            fused = fused_kernels("unscale_check", g) if g is not None else None
            if fused is not None and g.flags.c_contiguous:
                fused.unscale_check(g, inv, flag)
            else:
                rest.append(g)
        self.unscale_(rest)
        return self.local_inf_flag(rest, flag)

    def local_inf_flag(self, grads, flag=None):
        """This rank's overflow verdict as a device array [f]: f > 0 if any of ``grads``
        holds inf or NaN, else 0 (``flag``: one to go on from), never read here.

        Reading ``isfinite(g).all()`` per gradient would be one device->host wait per
        parameter; the flag stays on the device and the caller reads it once per step
        together with the norm (``parallel.step``), as PyTorch's GradScaler does.
        """
        flag = xp.zeros(1, dtype=xp.float32) if flag is None else flag
        for g in grads:
            if g is not None:
                flag = xp.maximum(flag, xp.logical_not(xp.isfinite(g)).any())
        return flag

    def inf_flag(self, grads, flag=None):
        """``local_inf_flag`` agreed over ``comm`` (max): the same on every rank."""
        return self.agree(self.local_inf_flag(grads, flag))

    def agree(self, flag):
        """The flag [f] made the same on every rank of ``comm`` (max), on the device."""
        if self.comm is not None and self.comm.size > 1:
            from minipar.comm import all_reduce
            all_reduce(self.comm, flag, op="max")
        return flag

    def update(self, found_inf):
        if not self.enabled:
            return
        if found_inf:
            self.skipped += 1
            self.clean_steps = 0
            if self.overflows_left <= 1:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            else:
                self.overflows_left -= 1
            return
        self.overflows_left = self.hysteresis
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.clean_steps = 0

    def state_dict(self):
        return {"scale": self.scale, "skipped": self.skipped, "clean_steps": self.clean_steps,
                "overflows_left": self.overflows_left}

    def load_state_dict(self, state):
        self.scale = float(state["scale"])
        self.skipped = int(state["skipped"])
        self.clean_steps = int(state["clean_steps"])
        self.overflows_left = int(state["overflows_left"])


def make_scaler(precision, comm=None, **options):
    """The scaler a precision needs: dynamic for fp16, disabled (S = 1) otherwise."""
    return DynamicLossScaler(enabled=(precision == "fp16"), comm=comm, **options)
