"""One training step on this replica's rows — the one every caller runs — and evaluation.

    train_step(parallel, optimizer, x, y, ...) -> StepResult
        forward + backward   K micro-batches (gradient accumulation): loss_k·S/K
                             backward, the synchroniser quiet (``no_sync``) until the
                             last, whose hooks start the communication; or, with a
                             pipeline, the schedule over M micro-batches
        optimizer step       ``parallel.step.Optimizer.step``: finish the gradient sync,
                             unscale, agree on overflow, norm, clip, AdamW, publish

Nothing else is in it: the trainer (``loop.py``) picks the batch, times it, logs its
result; the profiler (``observe/profiler.py``) wraps the same call in its phases; faults and
other probes attach as ``StepHooks`` from outside (``faults.register``).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from minipar import backend
from minipar.autograd import no_grad
from minipar.comm import all_reduce
from minipar.data import shard_rows
from minipar.nn.moe import moe_layers, update_selection_bias


def _no_phase(name):
    return contextlib.nullcontext()


@dataclass
class StepHooks:
    """What may be attached to a step from outside it (``faults.register``)."""
    before_step: list = field(default_factory=list)     # f(step), before the batch is used
    after_compute: list = field(default_factory=list)   # f(seconds) after forward + backward
                                                        # (a pipeline: after each piece of it)


@dataclass(frozen=True)
class StepResult:
    local_loss: float            # this replica's mean loss (a pipeline: this stage's part of it)
    grad_norm: Optional[float]   # before clipping; None for a skipped (fp16 overflow) step
    skipped: bool
    loss_scale: float            # the S this step's loss was scaled by (1 without fp16)
    forward_backward_s: float    # wall time of forward and backward
    update_s: float              # wall time of the optimizer step (its sync wait included)


def train_step(parallel, optimizer, x, y, grad_accum=1, grad_clip=None, weight=1.0,
               read_loss_now=False, phase=None, hooks=None, before_update=None):
    """One step on this replica's rows ``x``, ``y`` (host arrays; cp: its positions).
    ``weight``: load balancing's w_i (``balance.py``); ``read_loss_now``: read the loss
    before the optimizer step (so a timing of forward and backward is of the finished
    computation), else it rides the optimizer step's one device->host read.
    ``phase(name)``: a context around "forward", "backward" and "optimizer" (the
    profiler's); ``before_update()``: called between backward and the optimizer step
    (a background checkpoint save must have copied the state)."""
    phase = phase or _no_phase
    engine, t0 = parallel.engine, time.perf_counter()
    experts = moe_layers(parallel.module)
    for _, moe in experts:                 # the expert load counts this step's forwards
        moe.step_load.reset()
    unread = None     # the loss, left on the device to ride the optimizer step's one read
    if engine is not None:
        local = pipeline_forward_backward(engine, optimizer, x, y)
    else:
        local = forward_backward(parallel.model, optimizer, x, y, grad_accum, weight, phase,
                                 on_device=not read_loss_now)
        if not read_loss_now:
            unread, local = local, None
        for hook in (hooks.after_compute if hooks else ()):
            hook(time.perf_counter() - t0)
    t_update = time.perf_counter()
    if before_update is not None:
        before_update()
    with phase("optimizer"):
        norm = optimizer.step(grad_clip, read_along=unread)
    if not optimizer.last_skipped:          # a skipped step (fp16 overflow) moves no state
        balance_experts(experts, (optimizer.sync.comm, optimizer.tp_comm))
    if unread is not None:
        local = float(optimizer.read_along[0])
    if engine is None:
        local *= weight
    return StepResult(local, norm, optimizer.last_skipped, optimizer.last_scale,
                      t_update - t0, time.perf_counter() - t_update)


def balance_experts(experts, groups):
    """Loss-free balancing after the optimizer step (``nn/moe.py``): each bias-balanced MoE
    layer's choices of the step, this rank's micro-batches summed over ``groups`` — the
    ranks that route other tokens through the same layers: the data ranks (dp × cp), and
    the tensor-parallel ones (a MoE runs tp only with sequence parallelism, each tp rank
    routing its own positions) — one all-reduce of L·E numbers per group, move its
    selection bias.  Every rank then holds the same biases."""
    biased = [moe for _, moe in experts if moe.selection_bias is not None]
    if not biased:
        return
    counts = backend.xp.concatenate([moe.step_load.chosen for moe in biased]).astype(np.float64)
    for group in groups:
        if group is not None and group.size > 1:
            counts = all_reduce(group, counts)
    for i, moe in enumerate(biased):
        update_selection_bias(moe, counts[i * moe.n_experts:(i + 1) * moe.n_experts])


def forward_backward(model, optimizer, x, y, grad_accum, weight=1.0, phase=_no_phase,
                     on_device=False):
    """K micro-batches of this replica's rows; returns the mean local loss.  ``weight``
    multiplies what is back-propagated (load balancing's w_i = dp·n_i/N, ``balance.py``).
    ``phase(name)``: a context manager around each "forward" and "backward" (the profiler's).
    ``on_device``: the mean as a float64 array of the backend, not read (on a GPU each
    ``item()`` waits for the device; the trainer reads it with the optimizer's flag and norm)."""
    rows = x.shape[0] // grad_accum
    loss_sum = backend.xp.zeros((), dtype=backend.xp.float64) if on_device else 0.0
    for i in range(grad_accum):
        last = i == grad_accum - 1
        with (contextlib.nullcontext() if last else optimizer.no_sync()):
            xs, ys = x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]
            with phase("forward"):
                _, loss = model(backend.to_device(xs), backend.to_device(ys))
                scaled = optimizer.scale_loss(loss) * (weight / grad_accum)
            with phase("backward"):
                scaled.backward()
        loss_sum += loss.data.astype(backend.xp.float64) if on_device else loss.item()
    return loss_sum / grad_accum


def pipeline_forward_backward(engine, optimizer, x, y):
    """The schedule over M micro-batches; dp sync waits until after the last backward."""
    with optimizer.no_sync():
        loss = engine.run(x, y, loss_scale=optimizer.loss_scale)
    return 0.0 if loss is None else loss


def global_loss(grid, local_loss):
    """The mean loss of the global batch: summed over the pipeline stages (the last
    stage's loss, the others' 0 or their MoE layers' balancing losses), averaged over dp
    and cp (every cp rank holds the same number of positions, so the mean of means is
    the mean)."""
    if grid.pp == 1 and grid.dp_cp_comm.size == 1:
        return float(local_loss)   # nothing to gather: no trip to the device and back
    value = backend.to_device(np.array([local_loss]))
    if grid.pp > 1:
        value = all_reduce(grid.pp_comm, value)
    group = grid.dp_cp_comm
    return float(backend.to_host(all_reduce(group, value))[0]) / group.size


def evaluate(parallel, dataset, config, grid):
    """This replica's mean loss over ``config.eval_batches`` fixed validation batches.

    Evaluation is laid out as training is, so its memory peak is training's: each
    data-parallel replica takes its share of the rows, in grad-accum pieces (a pipeline:
    in its micro-batches).  Every rank calls it — tensor-parallel, ZeRO-3 and pipelined
    forwards are collective — and ``global_loss`` turns the replicas' means into the
    batch mean.  With a pipeline only the last stage knows the loss (0.0 elsewhere).
    """
    module, engine, k = parallel.module, parallel.engine, config.grad_accum
    module.eval()
    total = 0.0
    with no_grad():
        for i in range(config.eval_batches):
            x, y = dataset.batch(config.seed, i, config.batch_size, split="val")
            x, y = shard_rows(x, grid.coords.dp, grid.dp), shard_rows(y, grid.coords.dp, grid.dp)
            x, y = parallel.local_tokens(x), parallel.local_tokens(y)
            if engine is not None:
                loss = engine.evaluate(x, y)
                total += loss if grid.is_last_stage else 0.0
                continue
            rows = x.shape[0] // k
            for j in range(k):
                xs, ys = x[j * rows:(j + 1) * rows], y[j * rows:(j + 1) * rows]
                total += parallel.model(backend.to_device(xs), backend.to_device(ys))[1].item() / k
    module.train()
    return total / max(config.eval_batches, 1)
