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
ones are the same on every rank and must be counted once (``parallel/norm.py``):

    ||g||² = all_reduce_sum(Σ_sharded ||g_r||²/replicas + Σ_replicated ||g||²/t)

(``replicas`` > 1: a key/value head held by several ranks, ``tensor/llama.py``.)
"""
from __future__ import annotations

from minipar.optim import clip_grad_norm
from minipar.parallel.norm import GlobalNorm


def replicated(model, name):
    """True for a parameter held whole on every tp rank (not in the shard table)."""
    return name not in model.shard_specs


def reduce_replicated_grads(model):
    """With sequence parallelism, sum the replicated parameters' gradients over the tp
    group (no-op otherwise).  Call after backward, before clipping and the optimizer.
    (The trainer's optimizer step does the same on its slots: ``step.sum_partial_over_tp``.)"""
    if not model.sequence_parallel or model.comm.size == 1:
        return
    from minipar.parallel.step import sum_partial_over_tp
    from minipar.parallel.sync.slots import Slot
    slots = [Slot(p.data, p.grad, tp_replicated=True) for name, p in model.named_parameters()
             if p.grad is not None and replicated(model, name)]
    sum_partial_over_tp(slots, model.comm)


def tp_grad_norm(model):
    """The global L2 norm of the gradient of the whole (unsharded) model; the same float
    on every tp rank: Σ over tp of Σ w·g², replicated weights with w = 1/tp.
    ``model``: a TensorParallelGPT.  With dp, average the gradients over dp first."""
    t = model.comm.size
    norm = GlobalNorm([model.comm], lambda name: 1.0 / t if replicated(model, name)
                      else 1.0 / model.shard_specs[name].replicas)
    return norm.total(norm.local_sq((n, p.grad) for n, p in model.named_parameters()))


def clip_tp_grad_norm(model, max_norm):
    """Scale every local gradient by min(1, max_norm/||g||) with the global norm; returns it."""
    return clip_grad_norm(model.parameters(), max_norm, norm=tp_grad_norm(model))
