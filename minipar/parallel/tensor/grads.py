"""Gradient bookkeeping of a tensor-parallel model: replicated parameters, global norm.

Replicated parameters (LayerNorm gains and biases, row-parallel biases, the position
embedding) exist on every tp rank.

- Without sequence parallelism their gradients are already identical on every rank
  (they see the full, replicated activations, and f's all-reduce has made the incoming
  gradients equal).
- With sequence parallelism each rank saw only its s/t tokens, so its gradient is a
  partial sum:  dW = Σ_r dW_r.  ``reduce_replicated_grads`` all-reduces them over the tp
  group — explicitly, once per optimizer step after the last backward (one flat buffer,
  one all-reduce), as Megatron does; a hook per micro-batch would cost more messages.

Global gradient norm for clipping: sharded parameters hold disjoint slices, replicated
ones are the same on every rank and must be counted once:

    ||g||² = all_reduce_sum(Σ_sharded ||g_r||²) + Σ_replicated ||g||²
"""
from __future__ import annotations

import math

from minipar.backend import xp
from minipar.optim import clip_grad_norm
from minipar.parallel.tensor.regions import all_reduce_inplace


def _split(model):
    """(sharded, replicated) lists of parameters with a gradient."""
    sharded, replicated = [], []
    for name, p in model.named_parameters():
        if p.grad is not None:
            (sharded if name in model.shard_specs else replicated).append(p)
    return sharded, replicated


def reduce_replicated_grads(model):
    """With sequence parallelism, sum the replicated parameters' gradients over the tp
    group (no-op otherwise).  Call after backward, before clipping and the optimizer."""
    if not model.sequence_parallel or model.comm.size == 1:
        return
    _, replicated = _split(model)
    if not replicated:
        return
    flat = xp.concatenate([p.grad.reshape(-1) for p in replicated])
    all_reduce_inplace(model.comm, flat)
    start = 0
    for p in replicated:
        p.grad[...] = flat[start:start + p.grad.size].reshape(p.grad.shape)
        start += p.grad.size


def _sum_squares(params):
    return sum(float((p.grad.astype(xp.float64) ** 2).sum()) for p in params)


def tp_grad_norm(model):
    """The global L2 norm of the gradient of the whole (unsharded) model; the same float
    on every tp rank.  ``model``: a TensorParallelGPT (``named_parameters``, ``shard_specs``,
    ``comm``).  With dp, average the gradients over dp first."""
    sharded, replicated = _split(model)
    partial = xp.asarray([_sum_squares(sharded)], dtype=xp.float64)
    all_reduce_inplace(model.comm, partial)
    return math.sqrt(float(partial[0]) + _sum_squares(replicated))


def clip_tp_grad_norm(model, max_norm):
    """Scale every local gradient by min(1, max_norm/||g||) with the global norm; returns it."""
    return clip_grad_norm(model.parameters(), max_norm, norm=tp_grad_norm(model))
