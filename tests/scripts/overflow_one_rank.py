"""The trainer's fp16 step when ONE rank's gradient overflows, under mpiexec -n 4.

    mpiexec -n 4 python tests/scripts/overflow_one_rank.py

``parallel.step.Optimizer`` agrees the overflow flag over every rank inside the one
all-reduce that also sums ||g||² (``parallel.norm.GlobalNorm.summed_with_flag``).  Two
layouts, where the norm is summed over fewer ranks than must agree on the flag:

- dp2 x tp2, DDP: the norm is summed over tp only; the victim's dp peer holds the same
  gradient and is in none of the norm's groups (its part is weighted 1/2 instead);
- dp2 x pp2, ZeRO-1: the norm is summed over dp and pp.

After the gradient synchroniser has finished (so no collective could carry it further),
the last rank writes an inf into one of its master gradients at steps PLANT.  On every
rank: the other ranks' own gradients are finite (checked here, before the step); exactly
those steps are skipped, with masters, m, v and the step count unchanged; the scale keeps
through the first overflow (hysteresis 2) and halves at the second; clean steps change
the masters; their ||g||² equals the one summed group by group (the sum over the norm's
groups, as before the flag rode along) to 1e-12; and the step's only collective of a few
elements is that one all-reduce, [||g||², flag] over all 4 ranks (before: the flag over
4 ranks plus one per norm group).  Prints "OK <rank> <layout>".
"""
import math
import sys

import numpy as np

from minipar import backend
from minipar.comm import abort_on_exception, collectives
from minipar.train import TrainConfig, setup

STEPS, PLANT, SCALE = 5, (1, 2), 1024.0
SMALL = []      # "name/ranks/elements" of the optimizer step's collectives of 1 or 2 elements
NOTING = [False]
LAYOUTS = {"dp2-tp2-ddp": dict(tp=2), "dp2-pp2-zero1": dict(pp=2, zero=1, microbatches=2)}


def snapshot(opt):
    return ([backend.to_host(s.master).copy() for s in opt.sync.slots],
            [backend.to_host(a).copy() for a in opt.m + opt.v], opt.step_count)


def same(a, b):
    return a[2] == b[2] and all(np.array_equal(x, y) for x, y in zip(a[0] + a[1], b[0] + b[1]))


def run_layout(name, layout):
    config = TrainConfig(model="tiny", n_layer=2, d_model=32, seq_len=16, batch_size=8,
                         precision="fp16", initial_loss_scale=SCALE, steps=STEPS,
                         quiet=True, eval_batches=0, **layout)
    run = setup(config)
    run.warmup = 1                  # what ``Run.loop`` sets before its first step
    opt, rank, last = run.optimizer, run.grid.rank, run.grid.world.size - 1
    step_box, own_finite, groupwise = [0], [], []
    finish = opt.sync.finish

    def finish_then_plant():        # the synchroniser's collectives are done by now
        slots = finish()
        grads = [backend.to_host(s.grad) for s in slots if s.grad is not None]
        own_finite.append(all(np.isfinite(g).all() for g in grads))
        if rank == last and step_box[0] in PLANT:
            next(s for s in slots if s.grad is not None).grad.reshape(-1)[0] = np.inf
        return slots
    opt.sync.finish = finish_then_plant

    optimizer_step = opt.step

    def noted_step(*args, **kwargs):
        NOTING[0] = True
        try:
            return optimizer_step(*args, **kwargs)
        finally:
            NOTING[0] = False
    opt.step = noted_step

    summed_with_flag = opt.norm.summed_with_flag

    def and_group_by_group(local_sq, flag):   # the reference: summed over the groups alone
        NOTING[0] = False           # (the test's own collectives are not the step's)
        groupwise.append(float(backend.to_host(opt.norm.summed(local_sq))[0]))
        NOTING[0] = True
        return summed_with_flag(local_sq, flag)
    opt.norm.summed_with_flag = and_group_by_group

    skipped, scales = [], []
    for step in range(STEPS):
        step_box[0] = step
        before = snapshot(opt)
        SMALL.clear()
        shared, _ = run.step(step)
        if SMALL != ["all_reduce/4/2"]:
            raise AssertionError(f"{name} rank {rank} step {step}: the optimizer step's "
                                 f"collectives of 1 or 2 elements are {SMALL}")
        skipped.append(opt.last_skipped)
        scales.append(opt.scaler.scale)
        unchanged = same(before, snapshot(opt))
        if opt.last_skipped != unchanged:
            raise AssertionError(f"{name} rank {rank} step {step}: skipped {opt.last_skipped} "
                                 f"but state unchanged {unchanged}")
        if not opt.last_skipped:     # the step's ||g||, against the group-by-group sum
            norm = shared["grad_norm"]
            if not math.isclose(norm ** 2, groupwise[-1], rel_tol=1e-12):
                raise AssertionError(f"{name} rank {rank} step {step}: ||g||² {norm ** 2} "
                                     f"from the world, {groupwise[-1]} group by group")

    want = [s in PLANT for s in range(STEPS)]
    if skipped != want:
        raise AssertionError(f"{name} rank {rank}: skipped {skipped}, want {want}")
    if not all(own_finite):     # every skip came from the one planted inf
        raise AssertionError(f"{name} rank {rank}: own gradients not finite: {own_finite}")
    if scales[PLANT[0]] != SCALE or scales[PLANT[1]] != SCALE / 2 or scales[-1] != SCALE / 2:
        raise AssertionError(f"{name} rank {rank}: scales {scales}")
    if opt.scaler.skipped != len(PLANT) or opt.step_count != STEPS - len(PLANT):
        raise AssertionError(f"{name} rank {rank}: {opt.scaler.skipped} skipped, "
                             f"{opt.step_count} steps")
    print(f"OK {rank} {name} skipped={skipped} scales={scales}", flush=True)


def noting(check):
    def noted(ctx, name, local):       # every collective checks its arguments here first
        def local_noted():
            fields, elements, *rest = local()
            if NOTING[0] and ctx.size > 1 and 0 < elements <= 2:
                SMALL.append(f"{name}/{ctx.size}/{elements}")
            return (fields, elements, *rest)
        return check(ctx, name, local_noted)
    return noted


def main():
    abort_on_exception()
    collectives.check = noting(collectives.check)
    for name, layout in LAYOUTS.items():
        run_layout(name, layout)


if __name__ == "__main__":
    sys.exit(main())
