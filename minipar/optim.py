"""Optimizers, gradient clipping and the learning-rate schedule.

The update rules are written as functions of plain arrays (``sgd_update``,
``adamw_update``) so ZeRO can apply the very same math to a flat shard of the
parameters; the classes below apply them parameter by parameter.

AdamW (Loshchilov & Hutter), with bias correction and decoupled weight decay:
    m = β1·m + (1-β1)·g          v = β2·v + (1-β2)·g²
    p -= lr · ( m/(1-β1^t) / (sqrt(v/(1-β2^t)) + eps) + wd·p )
"""
from __future__ import annotations

import math

from minipar.backend import xp
from minipar.autograd import no_grad
from minipar.autograd.ops_math import fused_kernels
from minipar.autograd.rows import for_row_blocks


def sgd_update(p, g, buf, lr, momentum=0.0, weight_decay=0.0):
    """p -= lr·(b) with b = momentum·b + g + wd·p (in place)."""
    if weight_decay:
        g = g + weight_decay * p
    if buf is not None:
        buf *= momentum
        buf += g
        g = buf
    p -= lr * g


def adamw_update(p, g, m, v, step, lr, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0):
    """One AdamW step on arrays, in place (``step`` counts from 1).  ``weight_decay``
    may be an array (ZeRO passes a per-element mask over its flat shard).  Element by
    element, so a large array runs as blocks on the rank's threads (``autograd/rows.py``)."""
    # plain Python numbers: a NumPy float64 lr would make a float32 update float64 here
    # (NumPy's promotion) but not in the compiled kernels, and the two must agree to the bit
    lr, beta1, beta2, eps = float(lr), float(beta1), float(beta2), float(eps)
    if not getattr(weight_decay, "ndim", 0):
        weight_decay = float(weight_decay)
    m_hat_scale = 1.0 / (1 - beta1 ** step)
    v_hat_scale = 1.0 / (1 - beta2 ** step)
    per_element = not isinstance(weight_decay, float)
    arrays = (p, g, m, v) + ((weight_decay,) if per_element else ())
    if not all(a.flags.c_contiguous and a.shape == p.shape for a in arrays):
        _adamw_block(p, g, m, v, lr, beta1, beta2, eps, weight_decay, m_hat_scale, v_hat_scale)
        return
    if fused := fused_kernels("adamw", *arrays):  # one compiled pass
        fused.adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, m_hat_scale, v_hat_scale)
        return
    flat = [a.reshape(-1) for a in arrays]

    def block(lo, hi):
        pb, gb, mb, vb = (a[lo:hi] for a in flat[:4])
        wd = flat[4][lo:hi] if per_element else weight_decay
        _adamw_block(pb, gb, mb, vb, lr, beta1, beta2, eps, wd, m_hat_scale, v_hat_scale)

    for_row_blocks(p.size, block, p.size)


def _adamw_block(p, g, m, v, lr, beta1, beta2, eps, weight_decay, m_hat_scale, v_hat_scale):
    """The update of the module docstring, with two scratch arrays:
    update = (m·ŝ1) / (sqrt(v·ŝ2) + eps) + wd·p;  p -= lr·update."""
    step, scratch = xp.empty_like(m), xp.empty_like(m)
    m *= beta1
    xp.multiply(g, 1 - beta1, out=scratch)
    m += scratch
    v *= beta2
    xp.multiply(g, g, out=scratch)
    scratch *= 1 - beta2
    v += scratch
    xp.multiply(m, m_hat_scale, out=step)
    xp.multiply(v, v_hat_scale, out=scratch)
    xp.sqrt(scratch, out=scratch)
    scratch += eps
    step /= scratch
    if not isinstance(weight_decay, (int, float)) or weight_decay:
        xp.multiply(p, weight_decay, out=scratch)
        step += scratch
    step *= lr
    p -= step


def decays(name, p):
    """GPT convention: weight decay on matrices (weights, embeddings), not on biases or
    LayerNorm gains (``name`` is there for callers that want a finer rule)."""
    return p.ndim >= 2


class SGD:
    def __init__(self, named_params, lr=0.1, momentum=0.0, weight_decay=0.0):
        self.params = list(named_params)
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.state = {name: (xp.zeros_like(p.data) if momentum else None) for name, p in self.params}

    @no_grad()
    def step(self):
        for name, p in self.params:
            if p.grad is not None:
                wd = self.weight_decay if decays(name, p) else 0.0
                sgd_update(p.data, p.grad, self.state[name], self.lr, self.momentum, wd)

    def zero_grad(self):
        for _, p in self.params:
            p.grad = None


class AdamW:
    """AdamW over (name, Parameter) pairs; state m, v in the parameters' dtype."""

    def __init__(self, named_params, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        self.params = list(named_params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.step_count = 0
        self.state = {name: {"m": xp.zeros_like(p.data), "v": xp.zeros_like(p.data)}
                      for name, p in self.params}

    @no_grad()
    def step(self):
        self.step_count += 1
        for name, p in self.params:
            if p.grad is None:
                continue
            s = self.state[name]
            wd = self.weight_decay if decays(name, p) else 0.0
            adamw_update(p.data, p.grad, s["m"], s["v"], self.step_count, self.lr,
                         self.betas[0], self.betas[1], self.eps, wd)

    def zero_grad(self):
        for _, p in self.params:
            p.grad = None

    def state_dict(self):
        from minipar.backend import to_host
        return {"step": self.step_count,
                "m": {k: to_host(s["m"]).copy() for k, s in self.state.items()},
                "v": {k: to_host(s["v"]).copy() for k, s in self.state.items()}}

    def load_state_dict(self, state):
        from minipar.backend import to_device
        self.step_count = int(state["step"])
        for name, s in self.state.items():
            s["m"][...] = to_device(state["m"][name], dtype=s["m"].dtype)
            s["v"][...] = to_device(state["v"][name], dtype=s["v"].dtype)


def global_grad_norm(grads):
    """sqrt(Σ ||g||²) over every gradient array (None entries skipped)."""
    total = 0.0
    for g in grads:
        if g is not None:
            total += float((g.astype(xp.float64) ** 2).sum())
    return math.sqrt(total)


def clip_grad_norm(params, max_norm, norm=None):
    """Scale all gradients by min(1, max_norm / ||g||); returns the norm before clipping.
    A sharded caller passes the norm it computed over all shards."""
    grads = [p.grad for p in params]
    if norm is None:
        norm = global_grad_norm(grads)
    if max_norm and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads:
            if g is not None:
                g *= scale
    return norm


def lr_at(step, base_lr, warmup, total, min_ratio=0.1):
    """Linear warm-up for ``warmup`` steps, then cosine decay to min_ratio·base_lr at ``total``."""
    if warmup and step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
