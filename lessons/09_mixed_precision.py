"""Lesson 09 — skipping an fp16 step is a decision of the whole grid.

    mpiexec -n 3 python lessons/09_mixed_precision.py [--backend numpy|cupy] [--steps 10] [--plant 3,4]

Every rank trains its OWN fp16 model on its own rows, as tensor- or pipeline-parallel
ranks hold different parameters, with one ``DynamicLossScaler(comm=world)``: its
found-inf flag is max-reduced over every rank before anyone steps.  The last rank
writes an inf into one of its gradients at the steps of ``--plant``.  Each rank
prints one JSON line: the steps it skipped, the scale each step used, whether its
OWN gradients were non-finite (an un-reduced check), whether a skipped step left
masters, half weights and AdamW state untouched, and its losses (rank 0 gathers
and prints the lines).
"""
import argparse
import json
import os
import sys

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.amp import DynamicLossScaler, MixedPrecision, amp_optimizer_step
from minipar.comm import Communicator, abort_on_exception
from minipar.data import Dataset, load_corpus
from minipar.nn import GPT, GPTConfig
from minipar.optim import AdamW


def snapshot(amp, opt):
    """Everything a step may change, copied to the host."""
    arrays = [m.data for m in amp.masters] + [p.data for p in amp.params]
    arrays += [s[k] for s in opt.state.values() for k in ("m", "v")]
    return [backend.to_host(a).copy() for a in arrays], opt.step_count


def unchanged(a, b):
    return a[1] == b[1] and all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--plant", default="3,4", help="steps at which the last rank plants an inf")
    args = parser.parse_args()
    backend.set_backend(args.backend)
    backend.set_default_dtype(np.float32)
    comm = Communicator()
    abort_on_exception()
    rank, last = comm.rank, comm.size - 1
    plant = {int(s) for s in args.plant.split(",") if s}

    cfg = GPTConfig(n_layer=1, d_model=32, n_head=2, seq_len=16)
    data = Dataset(load_corpus(max_bytes=50_000), cfg.seq_len)
    model = GPT(cfg, seed=rank)                       # a different model on every rank
    amp = MixedPrecision(model, "fp16")
    opt = AdamW(amp.named_masters(), lr=3e-3, weight_decay=0.0)
    scaler = DynamicLossScaler(init_scale=2.0 ** 12, hysteresis=2, comm=comm)
    own_verdict = DynamicLossScaler(comm=None)        # this rank's gradients only

    step_now = [0]

    def plant_inf(param):                             # called once its gradient is in
        if rank == last and step_now[0] in plant:
            param.grad.reshape(-1)[0] = float("inf")
    amp.params[-1].register_hook(plant_inf)

    out = {"rank": rank, "skipped": [], "scales": [], "own_inf": [], "untouched": [], "losses": []}
    for step in range(args.steps):
        step_now[0] = step
        x, y = data.batch(rank, step % 2, 8)          # two batches, so the loss can fall
        before = snapshot(amp, opt)
        _, loss = model(backend.to_device(x), backend.to_device(y))
        with np.errstate(over="ignore", invalid="ignore"):
            scaler.scale_loss(loss).backward()
            amp.grads_to_masters()
            out["own_inf"].append(own_verdict.found_inf(amp.master_grads()))
            _, skipped, scale = amp_optimizer_step(amp, opt, scaler, grad_clip=1.0)
        out["skipped"].append(bool(skipped))
        out["scales"].append(scale)
        out["untouched"].append(unchanged(before, snapshot(amp, opt)))
        out["losses"].append(round(loss.item(), 4))
    out["optimizer_steps"] = opt.step_count
    everyone = comm.mpi.gather(out, root=0)           # one writer: lines never interleave
    if rank == 0:
        for record in everyone:
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    sys.exit(main())
