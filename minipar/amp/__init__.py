"""Mixed precision: a half-precision model, fp32 master weights, dynamic loss scaling.

The model's parameters and activations are held in fp16 or bf16 (half the bytes,
and on a GPU the tensor cores' fast path), while everything that accumulates stays
in float32 (Micikevicius et al., 2018, "Mixed Precision Training"):

- matmuls take half inputs and accumulate in fp32 (``ops_reduce._mm``); softmax,
  layer-norm statistics, losses and sums are computed in fp32 (``backend.widened``);
- ``MixedPrecision`` keeps an fp32 *master* copy of every parameter.  The optimizer
  (AdamW, with fp32 m and v) updates the masters; the half parameters are only a
  rounded copy, w_half = round(w32).  An update lr·u smaller than half an ulp of w
  would vanish if applied to w_half directly — it accumulates in w32 instead;
- fp16 has 5 exponent bits: normal numbers span 6.1e-5 .. 65504 (subnormals down to
  6e-8), so small gradients underflow to 0.  ``DynamicLossScaler`` multiplies the
  loss by S (2^16 at first): every gradient is S times larger, inside fp16's range,
  and the fp32 master gradients are divided by S again.  If any gradient came out
  inf/NaN, S was too large: the step is skipped (on every rank: the flag is agreed
  over the whole grid, by a max here and, in the trainer's step, inside the one
  all-reduce that also sums the gradient norm) and S is halved — after ``hysteresis``
  consecutive overflows (DeepSpeed).  After ``growth_interval`` clean steps S doubles (PyTorch's
  GradScaler), so S hovers just below the largest value that does not overflow.
- bf16 has fp32's 8 exponent bits (range ~1e-38 .. 3e38) but 8 bits of mantissa:
  no loss scaling (the scaler is disabled, S = 1), but the fp32 masters are kept.

One step (``amp_train_step``; ``amp_optimizer_step`` is the part after backward):

    loss·S  → backward (half grads)  → master.grad += fp32(p.grad)   per micro-batch
    master.grad /= S  → found_inf = max over ranks of any(!isfinite(master.grad))
    clean:  norm = ||g|| (unscaled), clip, AdamW on masters, p.data = half(master)
    else:   skip (weights and optimizer state untouched)
    scaler.update(found_inf)

For ZeRO the masters are what gets sharded: a rank keeps fp32 masters and m, v for
its shard only; the step applies ``scaler.unscale_`` / ``scaler.found_inf`` to its
shard of the gradient (``found_inf`` agrees over ``comm``) and the synchroniser
all-gathers half(master shard).

Modules: ``master`` (MixedPrecision), ``scaler`` (DynamicLossScaler, make_scaler),
``step`` (amp_optimizer_step, amp_train_step: one process).  The trainer's step for
every layout is ``parallel.step.Optimizer``; its synchronisers keep the masters
(``parallel.sync``: DDP through ``MixedPrecision``, ZeRO as fp32 shards).
"""
from minipar.amp.master import MixedPrecision
from minipar.amp.scaler import DynamicLossScaler, make_scaler
from minipar.amp.step import amp_optimizer_step, amp_train_step

__all__ = ["MixedPrecision", "DynamicLossScaler", "make_scaler", "amp_optimizer_step",
           "amp_train_step"]
