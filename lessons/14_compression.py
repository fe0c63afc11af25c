"""Lesson 14 — gradient compression: the same small GPT trained with every hook.

    mpiexec -n 2 python lessons/14_compression.py [--backend numpy|cupy] --json FILE

Every method trains the same GPT (same weights, same batches of real text) with
``DDPSync(model, comm, comm_hook=hook)``; the methods advance in lockstep (step k of
each, then step k+1), so a load spike hits them all alike.  Per step, rank 0 records the
loss, the bytes its transport counted for the step, the bytes the method's formula
predicts, the step time and the norm of its error-feedback residual; at the end the
validation loss, and this machine's α and β (``perf/calibrate_links.calibrate``).
"""
import argparse
import json
import os
import sys
import time

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from minipar import backend
from minipar.autograd import no_grad
from minipar.backend import sync, to_device
from minipar.comm import Communicator, abort_on_exception
from minipar.perf.calibrate_links import calibrate
from minipar.data import Dataset, load_corpus, shard_rows
from minipar.nn import GPT, GPTConfig
from minipar.parallel.step import Optimizer
from minipar.parallel.sync import DDPSync
from minipar.parallel.sync.compression import make_hook
from minipar.parallel.sync.compression.wire import ring_all_reduce_bytes

RUNS = {                                   # label: (method, make_hook options)
    "none": ("none", {}),
    "fp16": ("fp16", {}),
    "int8": ("int8", {}),
    "topk 1%": ("topk", {"ratio": 0.01}),
    "topk 1%, no error feedback": ("topk", {"ratio": 0.01, "error_feedback": False}),
    "powersgd r=2": ("powersgd", {"rank": 2, "start": 5}),
}


def build(comm, cfg, method, options):
    model = GPT(cfg, seed=0)
    hook = make_hook(method, **options)
    ddp = DDPSync(model, comm, algorithm="ring", comm_hook=hook)
    if hook is not None:
        hook.bind(ddp)
    return model, ddp, Optimizer(ddp, lr=2e-3), hook


def formula_bytes(hook, ddp, comm):
    """What the method's formula says this rank sends in one step (all buckets)."""
    if hook is None or hook.step <= hook.start:
        return sum(ring_all_reduce_bytes(b.padded, b.dtype.itemsize, comm.size, comm.rank)
                   for b in ddp.buckets)
    return sum(hook.expected_wire_bytes(b, comm.size, comm.rank) for b in ddp.buckets)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--json", required=True, help="where rank 0 writes the results")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    abort_on_exception()
    backend.set_backend(args.backend)
    comm = Communicator()
    cost = calibrate(comm)
    cfg = GPTConfig(n_layer=2, d_model=64, n_head=4, seq_len=32)
    data = Dataset(load_corpus(max_bytes=2_000_000), cfg.seq_len)
    share = lambda a: to_device(shard_rows(a, comm.rank, comm.size))  # noqa: E731
    runs = {label: build(comm, cfg, *spec) for label, spec in RUNS.items()}
    log = {label: {k: [] for k in ("loss", "bytes", "formula", "time", "residual")} for label in runs}
    for step in range(args.steps):
        x, y = (share(a) for a in data.batch(0, step, args.batch_size))
        for label, (model, ddp, opt, hook) in runs.items():
            comm.barrier()
            before, t0 = comm.bytes_sent, time.perf_counter()
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            sync()
            rec = log[label]
            rec["time"].append(time.perf_counter() - t0)
            rec["bytes"].append(comm.bytes_sent - before)
            rec["formula"].append(formula_bytes(hook, ddp, comm))
            rec["residual"].append(hook.residual_norm() if hook is not None else 0.0)
            rec["loss"].append(float(np.mean(comm.mpi.allgather(loss.item()))))
    for label, (model, ddp, opt, hook) in runs.items():
        with no_grad():
            vals = [model(*(share(a) for a in data.batch(0, i, args.batch_size, split="val")))[1].item()
                    for i in range(4)]
        log[label]["val_loss"] = float(np.mean(comm.mpi.allgather(float(np.mean(vals)))))
    result = {"ranks": comm.size, "alpha": cost.alpha, "beta": cost.beta,
              "params": runs["none"][0].num_parameters(), "runs": log}
    if comm.rank == 0:
        with open(args.json, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
