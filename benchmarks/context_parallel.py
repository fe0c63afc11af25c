"""Context parallelism, measured: per-rank attention time with the contiguous and the
zig-zag split, and activation memory per rank against cp.

    python benchmarks/context_parallel.py [--seq 2048] [--heads 4] [--head-dim 32]

1. Under ``mpiexec -n 2`` (launched here): ring attention forward + backward over a
   causal sequence of --seq positions, each rank timing its own share, for both splits.
   The step waits for the slowest rank, so max/mean is the price of imbalance (the
   contiguous split's last rank does 2x the mean pair work; zig-zag evens it out).
   The baseline in the same run: one process attending the whole sequence (cp = 1).
2. ``train`` for 2 steps at cp = 1, 2, 4 (seq 512): peak live bytes per rank from the log.
   Activations are ∝ S/C per rank; weights, gradients and optimizer state are not.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def attention_times(seq, heads, head_dim, repeats=3):
    """(under mpiexec) rank 0 prints per-rank seconds for each split."""
    sys.path.insert(0, ROOT)
    import numpy as np
    from minipar.autograd import Tensor
    from minipar.comm import Communicator
    from minipar.parallel.context import RingAttentionCore, positions_of
    from minipar.nn.attention import attention_core
    comm = Communicator()
    rng = np.random.default_rng(0)
    full = [rng.standard_normal((1, heads, seq, head_dim)).astype(np.float32) for _ in range(3)]
    result = {}
    for split in ("contiguous", "zigzag"):
        pos = positions_of(comm.rank, comm.size, seq, split == "zigzag")
        core = RingAttentionCore(comm, "naive", split == "zigzag")
        best = float("inf")
        for _ in range(repeats):
            q, k, v = (Tensor(np.ascontiguousarray(a[:, :, pos]), requires_grad=True) for a in full)
            comm.barrier()
            t0 = time.perf_counter()
            out = core(q, k, v)
            out.backward(np.ones_like(out.data))
            best = min(best, time.perf_counter() - t0)
        result[split] = comm.mpi.gather(best, root=0)
    if comm.rank == 0:
        q, k, v = (Tensor(a, requires_grad=True) for a in full)
        t0 = time.perf_counter()
        out = attention_core(q, k, v, "naive")
        out.backward(np.ones_like(out.data))
        result["single"] = time.perf_counter() - t0
        print("RESULT " + json.dumps(result), flush=True)


def memory_per_rank(seq, cps=(1, 2, 4)):
    rows = {}
    for cp in cps:
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "log.json")
            cmd = ["mpiexec", "-n", str(cp), sys.executable, "-m", "minipar", "train", "--cp", str(cp),
                   "--model", "small", "--seq-len", str(seq), "--steps", "2", "--batch-size", "4",
                   "--quiet", "--eval-batches", "0", "--log-json", log]
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
            sys.path.insert(0, ROOT)
            from minipar.observe.runlog import step_records
            rows[cp] = step_records(log)[-1]["peak_mem_bytes_per_rank"]
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--memory-seq", type=int, default=512)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return attention_times(a.seq, a.heads, a.head_dim)
    out = subprocess.run(["mpiexec", "-n", "2", sys.executable, __file__, "--worker", "--seq", str(a.seq),
                          "--heads", str(a.heads), "--head-dim", str(a.head_dim)],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.split("RESULT ", 1)[1])
    print(f"ring attention fwd+bwd, causal, S={a.seq}, {a.heads} heads x {a.head_dim}, cp=2, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  one process, whole sequence (baseline): {r['single'] * 1e3:8.1f} ms")
    for split in ("contiguous", "zigzag"):
        t = r[split]
        print(f"  {split:10s} per rank: " + ", ".join(f"{x * 1e3:7.1f} ms" for x in t)
              + f"   max/mean {max(t) / (sum(t) / len(t)):.2f}   step (max) {max(t) * 1e3:.1f} ms")
    zc, zz = max(r["contiguous"]), max(r["zigzag"])
    print(f"  zig-zag step / contiguous step: {zz / zc:.2f}")
    mem = memory_per_rank(a.memory_seq)
    print(f"peak live bytes per rank, small model, seq {a.memory_seq}, batch 4 (train, 2 steps):")
    for cp, peaks in mem.items():
        print(f"  cp={cp}: " + ", ".join(f"{p / 2**20:.1f} MiB" for p in peaks)
              + f"   ratio to cp=1: {max(peaks) / max(mem[1]):.2f}")


if __name__ == "__main__":
    sys.exit(main())
