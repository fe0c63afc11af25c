"""One mixed-precision optimizer step, as functions and as the loop's optimizer object."""
from __future__ import annotations

from minipar.backend import to_device
from minipar.optim import clip_grad_norm, global_grad_norm


def amp_optimizer_step(amp, optimizer, scaler, grad_clip=0.0, norm_fn=None):
    """Everything after the backward passes of one step.

    Unscale the fp32 master gradients, agree on found-inf, then either (clean) clip
    by the norm of the unscaled gradients, step the optimizer on the masters and
    round them into the half parameters, or (overflow) skip.  ``norm_fn`` maps
    [(name, grad)] to the global norm when gradients are sharded (tensor/pipeline
    parallel, e.g. ``lambda ng: g.total(g.local_sq(ng))`` with a
    ``parallel.norm.GlobalNorm`` g); default ``global_grad_norm``.
    Returns (grad_norm or None when skipped, skipped, the scale S this step used).
    """
    scale = scaler.scale
    grads = amp.master_grads()
    scaler.unscale_(grads)
    skipped = scaler.found_inf(grads)
    norm = None
    if not skipped:
        norm = norm_fn(list(zip(amp.names, grads))) if norm_fn else global_grad_norm(grads)
        clip_grad_norm(amp.masters, grad_clip, norm=norm)
        optimizer.step()
        amp.masters_to_model()
    scaler.update(skipped)
    amp.zero_grad()
    optimizer.zero_grad()
    return norm, skipped, scale


def amp_train_step(model, amp, optimizer, scaler, x, y, grad_accum=1, grad_clip=0.0,
                   norm_fn=None):
    """A whole step in mixed precision: K micro-batches of (loss·S/K).backward(),
    fp32 accumulation in the masters, then ``amp_optimizer_step``.

    Returns (mean loss, grad_norm or None if skipped, skipped, loss scale used).
    """
    rows = x.shape[0] // grad_accum
    weight = scaler.scale / grad_accum if scaler.enabled else 1.0 / grad_accum
    loss_sum = 0.0
    for i in range(grad_accum):
        xs, ys = x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]
        _, loss = model(to_device(xs), to_device(ys))
        (loss * weight).backward()
        amp.grads_to_masters()
        loss_sum += loss.item()
    norm, skipped, scale = amp_optimizer_step(amp, optimizer, scaler, grad_clip, norm_fn)
    return loss_sum / grad_accum, norm, skipped, scale


class AmpAdamW:
    """AdamW on fp32 masters behind the training loop's optimizer interface.

    Same surface as ``parallel.data.DataParallelAdamW`` (``step(max_norm) -> norm``,
    ``zero_grad``, ``lr``, ``ddp``, ``exposed_comm_s``, ``memory_bytes``,
    ``state_dict``), plus ``scale_loss`` for the backward and, after each ``step``,
    ``last_skipped`` / ``last_scale`` for the log.  With a ``DataParallel`` wrapper
    (``ddp``) the half gradients are averaged by its hooks (accumulated in half over
    micro-batches under ``no_sync``) and moved to the masters in ``step``.
    ``step`` returns None as the norm of a skipped step.
    """

    stage = 0

    def __init__(self, amp, scaler, ddp=None, norm_fn=None, prepare_grads=None, **adam):
        from minipar.optim import AdamW
        self.amp, self.scaler, self.ddp, self.norm_fn = amp, scaler, ddp, norm_fn
        self.prepare_grads = prepare_grads   # after the dp sync (tensor parallel replicas)
        self.adam = AdamW(amp.named_masters(), **adam)
        self.last_skipped, self.last_scale = False, scaler.scale

    lr = property(lambda self: self.adam.lr, lambda self, v: setattr(self.adam, "lr", v))

    def scale_loss(self, loss):
        return self.scaler.scale_loss(loss)

    def step(self, max_norm=None):
        if self.ddp is not None:
            self.ddp.finish_gradient_sync()
        if self.prepare_grads:
            self.prepare_grads()
        self.amp.grads_to_masters()
        norm, self.last_skipped, self.last_scale = amp_optimizer_step(
            self.amp, self.adam, self.scaler, max_norm, self.norm_fn)
        return norm

    def zero_grad(self):
        self.amp.zero_grad()

    @property
    def exposed_comm_s(self):
        return self.ddp.exposed_comm_s if self.ddp is not None else 0.0

    def memory_bytes(self):
        """Bytes per parameter: 2 + 4 (half weight, fp32 master), 2 + 4 (half gradient,
        fp32 master gradient; not both at once), 8 (m, v): 20, against fp32's 16."""
        half = sum(p.data.nbytes for p in self.amp.params)
        master = sum(m.data.nbytes for m in self.amp.masters)
        states = sum(s["m"].nbytes + s["v"].nbytes for s in self.adam.state.values())
        return {"params": half + master, "grads": half + master, "optimizer": states}

    def model_state_dict(self):
        """The fp32 masters by name: what a checkpoint keeps."""
        from minipar.backend import to_host
        return {name: to_host(m.data).copy() for name, m in self.amp.named_masters()}

    def state_dict(self):
        return self.adam.state_dict()

    def load_state_dict(self, state):
        self.adam.load_state_dict(state)
