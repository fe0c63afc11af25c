"""One mixed-precision optimizer step on one process, as functions (lesson 09's view).

The trainer's step, for every synchroniser and layout, is ``parallel.step.Optimizer``:
the same sequence (unscale, found_inf, norm, clip, AdamW, round into the model) on the
slots a gradient synchroniser hands it.
"""
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
