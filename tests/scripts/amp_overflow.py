"""Overflow injection under mpiexec: an inf planted in ONE rank's gradient.

Every rank trains its own fp16 model on its own data (as pipeline stages or tensor
shards do: different parameters, different gradients), with one DynamicLossScaler
whose found-inf flag is reduced over the world communicator.  On the last rank an
inf is written into one gradient at steps PLANT.  Every rank must:
- skip exactly those steps (although its own gradients are finite: checked with a
  local, un-reduced flag),
- keep masters, half weights and AdamW state (m, v, step count) unchanged there,
- keep the scale through the first overflow (hysteresis 2) and halve it at the second,
- then resume: later steps are taken and the loss falls.
Prints "OK <rank> scales=..." per rank; any failure raises (and aborts the job).
"""
import sys

import numpy as np

from minipar import backend
from minipar.amp import MixedPrecision, DynamicLossScaler, amp_optimizer_step
from minipar.comm import Communicator, abort_on_exception
from minipar.data import Dataset, load_corpus
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW

STEPS, PLANT = 10, (3, 4)


def snapshot(amp, opt):
    return ([m.data.copy() for m in amp.masters], [p.data.copy() for p in amp.params],
            {k: (s["m"].copy(), s["v"].copy()) for k, s in opt.state.items()}, opt.step_count)


def same(a, b):
    ma, pa, sa, ca = a
    mb, pb, sb, cb = b
    return (ca == cb and all(np.array_equal(x, y) for x, y in zip(ma + pa, mb + pb))
            and all(np.array_equal(sa[k][i], sb[k][i]) for k in sa for i in (0, 1)))


def main():
    comm = Communicator()
    abort_on_exception()
    rank, last = comm.rank, comm.size - 1
    cfg = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16)
    data = Dataset(load_corpus(max_bytes=50_000), cfg.seq_len)
    model = GPT(cfg, seed=rank)
    amp = MixedPrecision(model, "fp16")
    opt = AdamW(amp.named_masters(), lr=3e-3, weight_decay=0.0)
    scaler = DynamicLossScaler(init_scale=2.0 ** 12, hysteresis=2, comm=comm)
    local_check = DynamicLossScaler(comm=None)        # this rank's own verdict, for the record
    step_box = [0]
    victim = amp.params[-1]

    def plant(p):
        if rank == last and step_box[0] in PLANT:
            p.grad.reshape(-1)[0] = np.inf
    victim.register_hook(plant)

    losses, skips, scales, local = [], [], [], []
    for step in range(STEPS):
        step_box[0] = step
        x, y = data.batch(rank, step % 2, 8)          # two batches, so the loss can fall
        before = snapshot(amp, opt)
        _, loss = model(backend.to_device(x), backend.to_device(y))
        scaler.scale_loss(loss).backward()
        amp.grads_to_masters()
        local.append(local_check.found_inf([g * (1.0 / scaler.scale) for g in amp.master_grads()
                                            if g is not None]))
        _, skipped, _ = amp_optimizer_step(amp, opt, scaler, grad_clip=1.0)
        losses.append(loss.item())
        skips.append(skipped)
        scales.append(scaler.scale)
        if skipped and not same(before, snapshot(amp, opt)):
            raise AssertionError(f"rank {rank}: step {step} was skipped but state changed")
        if not skipped and same(before, snapshot(amp, opt)):
            raise AssertionError(f"rank {rank}: step {step} was taken but nothing changed")

    want = [s in PLANT for s in range(STEPS)]
    if skips != want:
        raise AssertionError(f"rank {rank}: skipped {skips}, want {want}")
    if rank != last and any(local):
        raise AssertionError(f"rank {rank}: own gradients were not finite: {local}")
    if rank == last and [local[s] for s in PLANT] != [True] * len(PLANT):
        raise AssertionError(f"rank {rank}: the planted inf was not seen locally")
    s0 = 2.0 ** 12
    if scales[PLANT[0]] != s0 or scales[PLANT[1]] != s0 / 2 or scales[-1] != s0 / 2:
        raise AssertionError(f"rank {rank}: scales {scales}")
    if scaler.skipped != len(PLANT) or opt.step_count != STEPS - len(PLANT):
        raise AssertionError(f"rank {rank}: skipped {scaler.skipped}, steps {opt.step_count}")
    if not losses[-1] < losses[PLANT[-1] + 1] < losses[1]:   # all on batch 1
        raise AssertionError(f"rank {rank}: training did not resume: {losses}")
    print(f"OK {rank} scales={scales} losses={[round(v, 3) for v in losses]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
