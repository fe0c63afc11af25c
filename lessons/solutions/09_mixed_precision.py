"""Solutions of lesson 09's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "half_weight_after": r'''
def half_weight_after(w0, delta, steps, master):
    """The fp16 weight after `steps` updates of +delta from w0 (see above); a np.float16."""
    dtype = np.float32 if master else np.float16
    w, step = dtype(w0), dtype(delta)
    for _ in range(steps):
        w = dtype(w + step)          # every sum rounded to the dtype that holds the weight
    return np.float16(w)             # the model computes with the fp16 rounding
''',
    "scaler_update": r'''
def scaler_update(scale, clean_steps, overflows_left, found_inf, *, growth_factor=2.0,
                  backoff_factor=0.5, growth_interval=2000, hysteresis=2, min_scale=1.0):
    """One step of the dynamic loss scale: returns (scale, clean_steps, overflows_left)."""
    if found_inf:
        if overflows_left <= 1:      # the hysteresis-th overflow in a row, or later
            scale = max(scale * backoff_factor, min_scale)
        else:
            overflows_left -= 1
        return scale, 0, overflows_left
    clean_steps += 1
    if clean_steps >= growth_interval:
        scale, clean_steps = scale * growth_factor, 0
    return scale, clean_steps, hysteresis
''',
    "amp_step": r'''
%%writefile {MINE}/my_amp_step.py
import math

import numpy as np
from minipar.comm import all_reduce


def amp_step(comm, model, masters, optimizer, scaler, x, y, max_norm):
    """One fp16 training step of data parallelism; returns (this rank's loss, the norm or None if skipped)."""
    params = model.parameters()
    S = scaler.scale
    _, loss = model(x, y)
    (loss * S).backward()                                  # half gradients of S·loss
    # the mean over the replicas, as DDP takes it: g/p on every rank, summed in half precision
    flat = np.concatenate([p.grad.reshape(-1) for p in params]) * (1.0 / comm.size)
    all_reduce(comm, flat)
    grads = flat.astype(np.float32) * (1.0 / S)            # unscaled, in fp32
    # one message: this rank's share of ||g||² and its overflow flag, summed over the ranks
    found_inf = float(not np.isfinite(grads).all())
    total = all_reduce(comm, np.array([np.sum(grads.astype(np.float64) ** 2) / comm.size, found_inf]))
    for p in params:
        p.grad = None
    if total[1] > 0:                                       # an inf or NaN on some rank: every rank skips
        scaler.update(True)
        return loss.item(), None
    norm = math.sqrt(total[0])
    if norm > max_norm:
        grads *= max_norm / (norm + 1e-6)
    start = 0
    for m in masters:
        m.grad = grads[start:start + m.data.size].reshape(m.shape)
        start += m.data.size
    optimizer.step()                                       # AdamW on the fp32 masters
    optimizer.zero_grad()
    for p, m in zip(params, masters):
        p.data[...] = m.data.astype(p.data.dtype)           # publish: round into the half weights
    scaler.update(False)
    return loss.item(), norm
''',
}
