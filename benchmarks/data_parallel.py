"""Data parallelism: tokens/s at 1 and 2 ranks, and what overlapping the all-reduce buys.

    python benchmarks/data_parallel.py [--np 2] [--d-model 256 --n-layer 4 --seq-len 128]
                                       [--batch-size 16] [--steps 8] [--repeats 2]

Launches ``mpiexec -n N python -m minipar train`` itself (float32, no thread variables:
minipar budgets its threads; the same global batch everywhere) for three configurations, interleaved ``--repeats`` times so
that a load spike on a shared machine hits all of them alike:

    1 rank                    the baseline (no communication)
    N ranks, overlap          all-reduces started from gradient hooks during backward
    N ranks, --no-overlap     all-reduces after backward

and, separately, the time of one blocking all-reduce of the whole gradient (4Ψ bytes)
on N ranks with both ranks already waiting: the pure transfer cost; and the share of a
ring step's bytes that move while the ranks compute without calling MPI.  Overlap pays
only for that share: the rest (all of it over shared memory, one machine) is copying that
the ranks do themselves inside MPI calls, and on busy cores moving it into backward moves
the copying, it does not remove it.  The exposed
communication of a step is larger: it also contains the skew between the ranks (a rank
that finished backward first waits for the other) and packing the buckets.  Step 0 (warm-up,
calibration of the collectives' cost model) is excluded; figures are medians over steps
and repeats.  Printed: step time, exposed communication per step (``comm_time_s`` of the
log: time blocked waiting for gradients plus the loss all-reduce), tokens/s, and the
ratios N-rank tokens/s ÷ 1-rank and overlap step time ÷ no-overlap step time, the share of
the exposed communication that overlap hides, and the compute time per step (step time
minus exposed communication), which shows what overlap costs the compute on a shared CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def probe_allreduce(nbytes, repeats=10):
    """(under mpiexec) median seconds of a blocking all-reduce of ``nbytes`` of float32;
    then whether bytes move while a rank computes (``probe_background``)."""
    sys.path.insert(0, ROOT)
    import numpy as np
    from minipar.comm import Communicator, all_reduce
    comm = Communicator()
    flat = np.ones(nbytes // 4, dtype=np.float32)
    all_reduce(comm, flat)                                  # warm-up + cost-model calibration
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        all_reduce(comm, flat)
        times.append(time.perf_counter() - t0)
    moved = probe_background(comm, flat[: flat.size // comm.size], repeats)
    if comm.rank == 0:
        print("ALLREDUCE", statistics.median(times), "BACKGROUND", moved)


def probe_background(comm, chunk, repeats):
    """The share of a ring step's transfer (``chunk`` to the right, as much from the left)
    that completes while both ranks compute without calling MPI.  1: the bytes move by
    themselves (a NIC's DMA) and overlap can hide them; 0: they move only inside MPI
    calls, as the ranks' own copies (shared memory), so hiding them costs compute."""
    import numpy as np
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    into = np.empty_like(chunk)
    a = np.ones((256, 256), dtype=np.float32)

    def exchange(compute_s):
        comm.barrier()
        reqs = [comm.irecv(into, left, tag=7), comm.isend(chunk, right, tag=7)]
        end = time.perf_counter() + compute_s
        while time.perf_counter() < end:
            a @ a                                           # compute, no MPI call
        t0 = time.perf_counter()
        for r in reqs:
            r.wait()
        return time.perf_counter() - t0

    alone = statistics.median(exchange(0.0) for _ in range(repeats))
    after = statistics.median(exchange(5 * alone + 0.005) for _ in range(repeats))
    return max(0.0, 1.0 - after / alone) if alone > 0 else 1.0


def env():
    """The caller's environment without thread variables: minipar budgets its threads
    itself (two ranks on two cores: one each), as for a user."""
    keep = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    return dict(keep, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def train(nprocs, model_flags, extra, workdir, tag, timeout):
    log = os.path.join(workdir, f"{tag}.json")
    cmd = ["mpiexec", "-n", str(nprocs), sys.executable, "-m", "minipar", "train", *model_flags,
           "--log-json", log, "--quiet", "--eval-batches", "0", *extra]
    subprocess.run(cmd, cwd=ROOT, env=env(), check=True, timeout=timeout)
    sys.path.insert(0, ROOT)
    from minipar.observe.runlog import step_records
    return step_records(log)[1:]     # drop step 0 (warm-up)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--bucket-mb", type=float, default=1.0)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--probe-allreduce", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe_allreduce:
        return probe_allreduce(args.probe_allreduce)

    model = ["--n-layer", str(args.n_layer), "--d-model", str(args.d_model), "--n-head",
             str(args.n_head), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
             "--steps", str(args.steps), "--precision", "fp32", "--seed", "0",
             "--data", os.path.join(ROOT, "minipar"), "--bucket-mb", str(args.bucket_mb)]
    configs = [("1 rank", 1, []), (f"{args.np} ranks, overlap", args.np, []),
               (f"{args.np} ranks, no overlap", args.np, ["--no-overlap"])]
    records = {name: [] for name, _, _ in configs}
    first = None
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.repeats):
            for i, (name, n, extra) in enumerate(configs):
                steps = train(n, model, extra, work, f"c{i}r{r}", args.timeout)
                records[name] += steps
                first = first or steps[0]
    psi_bytes = first["model_state_bytes"]["grads"]
    probe = subprocess.run(["mpiexec", "-n", str(args.np), sys.executable, os.path.abspath(__file__),
                            "--probe-allreduce", str(psi_bytes)], cwd=ROOT, env=env(), check=True,
                           capture_output=True, text=True, timeout=args.timeout)
    allreduce_s, _, moved = probe.stdout.split("ALLREDUCE", 1)[1].split()[:3]
    allreduce_s, moved = float(allreduce_s), float(moved)

    tokens = args.batch_size * args.seq_len
    print(f"\nGPT n_layer={args.n_layer} d_model={args.d_model} seq={args.seq_len}, global batch "
          f"{args.batch_size} ({tokens} tokens/step), fp32, {psi_bytes / 2**20:.1f} MiB of gradients, "
          f"buckets {args.bucket_mb} MiB; {args.steps - 1} steps x {args.repeats} repeats, medians\n")
    print(f"{'configuration':24} {'step s':>8} {'exposed comm s':>15} {'comm share':>11} {'tokens/s':>9}")
    summary = {}
    for name, _, _ in configs:
        step = statistics.median(s["step_time_s"] for s in records[name])
        comm = statistics.median(s["comm_time_s"] for s in records[name])
        summary[name] = (step, comm, tokens / step)
        print(f"{name:24} {step:8.3f} {comm:15.4f} {comm / step:10.1%} {tokens / step:9.0f}")
    base, ov, no = (summary[name] for name, _, _ in configs)
    print(f"\nblocking all-reduce of the whole gradient on {args.np} ranks: {allreduce_s:.4f} s")
    print(f"share of a ring step's bytes that move while both ranks compute: {moved:.0%} "
          f"(0%: the transfer is the ranks' own copies, made inside MPI calls)")
    print(f"tokens/s, {args.np} ranks (overlap) / 1 rank   : {ov[2] / base[2]:.2f}x  "
          f"(ideal {args.np}x)")
    print(f"tokens/s, {args.np} ranks (no overlap) / 1 rank: {no[2] / base[2]:.2f}x")
    print(f"step time, overlap / no overlap       : {ov[0] / no[0]:.3f}")
    print(f"exposed comm hidden by overlap        : {1 - ov[1] / no[1]:.0%} "
          f"({no[1]:.4f} s without -> {ov[1]:.4f} s with)")
    c_base, c_ov, c_no = base[0] - base[1], ov[0] - ov[1], no[0] - no[1]
    print(f"compute per step (step - exposed comm): 1 rank {c_base:.3f} s, {args.np} ranks "
          f"{c_no:.3f} s without overlap ({c_no / (c_base / args.np):.2f}x the ideal 1/{args.np}), "
          f"{c_ov:.3f} s with overlap ({c_ov / c_no - 1:+.0%}: what advancing the rings at "
          f"the gradient hooks costs the compute)")

if __name__ == "__main__":
    main()
