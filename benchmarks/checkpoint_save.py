"""Checkpoint save time: every rank writing its shards vs the old gathered write, and
how much of a save ``--save-async`` hides behind training.

    mpiexec -n 4 python benchmarks/checkpoint_save.py [--model gpt2] [--seq-len 64]
            [--batch-size 4] [--zero 3] [--tp 1] [--pp 1] [--dir DIR] [--repeats 2]
            [--no-gathered]

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_save.py --no-gathered --repeats 3
                                          (the async figure: one process, one
                                          compute thread, a core free for the writer)

One run is set up as ``train`` sets it up (dp = ranks / (tp·pp)); after a warm-up step it
measures, barrier to barrier (the slowest rank), the best of ``--repeats`` (async:
each repeat against a step timed just before it, and their median):

    step        a training step, no save in flight (the baseline: median of 4)
    sharded     ``Saver.save`` synchronously: each rank writes its pieces, rank 0 the
                index, the commit (minipar's checkpoint now)
    gathered    the write of before this change, kept here only: ZeRO shards, tp slices
                and pipeline stages gathered to world rank 0, which writes one .npz
    async       ``--save-async``: ``save`` returns at once; the writer thread writes
                the live state while the next step's forward and backward run (its
                optimizer step waits for the bytes to be written), then fsyncs while
                steps go on; the window ends with the step whose boundary committed
                the checkpoint.  exposed = window - steps·step (step: the median of 3
                just before); hidden = 1 - exposed / sharded (goal: >= 80%).
                The first step of the window is printed too: its optimizer step is
                the one that waits for the write

Files go to --dir (default a temporary directory, removed at the end; the same disk for
both writers).  Timings on a shared machine are noisy; the baseline is measured in
the same run.  The writer thread can only hide the save where a core is free for it:
with as many busy ranks as cores (4 ranks on 2 cores) every core is training and the
write takes its time from the steps.  So the header prints the cores, the ranks, the
compute threads per rank (``OMP_NUM_THREADS``) and the load average before and after;
one process with one compute thread on a machine of 2 or more cores is the measurement
that says what the async path hides (``--zero`` defaults to 0 for one process).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def gathered_save(run, directory):
    """The old path (minipar-checkpoint-1): gather everything to world rank 0, which
    writes one ``checkpoint.npz`` of full arrays (fsynced)."""
    opt, grid, tp_model = run.optimizer, run.grid, run.parallel.tp_model
    state, params = opt.state_dict(), opt.model_state_dict()       # collective under ZeRO
    if tp_model is not None:
        params = tp_model.gather_full_arrays(params)
        state = dict(state, m=tp_model.gather_full_arrays(state["m"]),
                     v=tp_model.gather_full_arrays(state["v"]))
    if grid.pp > 1:
        parts = grid.pp_comm.mpi.gather((params, state), root=0)
        if parts is not None:
            params = {k: v for p, _ in parts for k, v in p.items()}
            state = {"m": {k: v for _, s in parts for k, v in s["m"].items()},
                     "v": {k: v for _, s in parts for k, v in s["v"].items()}}
    if grid.rank == 0:
        arrays = {f"param/{k}": v for k, v in params.items()}
        arrays.update({f"adam_m/{k}": v for k, v in state["m"].items()})
        arrays.update({f"adam_v/{k}": v for k, v in state["v"].items()})
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "checkpoint.npz"), "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())


def timed(world, fn):
    world.barrier()
    t0 = time.perf_counter()
    out = fn()
    world.barrier()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--zero", type=int, default=None, help="default: 3, or 0 for one process")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-gathered", action="store_true",
                    help="skip the gathered save of before (slow for one process, not async)")
    args = ap.parse_args()
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    if args.zero is None:
        args.zero = 3 if world.size > 1 else 0
    base = args.dir or (tempfile.mkdtemp(prefix="ckpt-bench-") if world.rank == 0 else None)
    base = world.bcast(base, root=0)
    try:
        measure(args, world, base)
    finally:
        world.barrier()
        if world.rank == 0 and not args.dir:
            shutil.rmtree(base, ignore_errors=True)
        world.barrier()


def measure(args, world, base):
    from mpi4py import MPI
    from minipar.train import TrainConfig, setup
    config = TrainConfig(model=args.model, seq_len=args.seq_len, batch_size=args.batch_size,
                         zero=args.zero, tp=args.tp, pp=args.pp, steps=1000, quiet=True,
                         eval_batches=0, save=os.path.join(base, "sharded"), keep=1,
                         skip_memory_check=True)
    load_before = os.getloadavg()[0]
    run = setup(config)
    run.warmup = 10
    step = [0]

    def one_step():
        run.step(step[0])
        step[0] += 1
    one_step()                                                        # warm-up
    t_step = float(np.median([timed(world, one_step)[0] for _ in range(4)]))
    sharded = min(timed(world, lambda: run.saver.save(step[0]))[0] for _ in range(args.repeats))
    gathered = None
    if not args.no_gathered:
        gathered = min(timed(world, lambda: gathered_save(run, os.path.join(base, "gathered")))[0]
                       for _ in range(args.repeats))
    run.config = replace(run.config, save_async=True)
    hidden = []                    # per repeat, against the steps measured just before it
    for _ in range(args.repeats):
        base = float(np.median([timed(world, one_step)[0] for _ in range(3)]))
        world.barrier()
        t0, n = time.perf_counter(), 0
        run.saver.save(step[0])
        copy = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)   # save() itself
        first = None               # the step whose optimizer step waits for the write
        while run.saver.pending is not None:
            t_step0 = time.perf_counter()
            one_step()
            run.saver.poll()
            first = time.perf_counter() - t_step0 if first is None else first
            n += 1
        world.barrier()
        window = time.perf_counter() - t0
        first = world.allreduce(first, op=MPI.MAX)
        hidden.append((1 - (window - n * base) / sharded, window, n, base, copy, first))
    if world.rank == 0:
        from minipar import checkpoint
        index = checkpoint.open_checkpoint(config.save).index
        total = sum(index["files"].values())
        print(f"{args.model}, seq {args.seq_len}, batch {args.batch_size}, {world.size} ranks, "
              f"{run.config.layout_name()}; checkpoint {total / 2**20:.0f} MiB in "
              f"{len(index['files'])} files; best of {args.repeats}")
        print(f"  {os.cpu_count()} cores, {world.size} rank(s) of OMP_NUM_THREADS="
              f"{os.environ.get('OMP_NUM_THREADS', 'unset')}; load average {load_before:.2f} "
              f"before, {os.getloadavg()[0]:.2f} after")
        print(f"  step (no save)          {t_step:8.3f} s")
        print(f"  sharded save (sync)     {sharded:8.3f} s   {total / 2**20 / sharded:7.1f} MiB/s")
        if gathered is not None:
            print(f"  gathered save (before)  {gathered:8.3f} s   sharded is {gathered / sharded:.2f}x faster")
        for share, window, n, base, copy, first in hidden:
            print(f"  async: save returned in {copy:.3f} s; {n} step(s) in a {window:.3f} s window "
                  f"(a step just before: {base:.3f} s, median of 3; the first in the window "
                  f"{first:.3f} s); exposed {window - n * base:.3f} s; "
                  f"hidden {100 * share:.0f}% of the sync save")
        print(f"  async hidden, median of {len(hidden)}: "
              f"{100 * float(np.median([h[0] for h in hidden])):.0f}%")


if __name__ == "__main__":
    main()
