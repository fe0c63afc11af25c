"""Lesson 04 — collectives by hand: every all-reduce algorithm, checked and counted.

    mpiexec -n 4 python lessons/04_collectives.py [--backend numpy|cupy] [--sizes 1K,64K,1M]
                                                  [--ranks-per-node 2] [--json FILE]

For each algorithm and size every rank all-reduces its own data, checks the result
against NumPy (each rank can recompute every other rank's input), and the traffic
counters are compared with the textbook volume (bytes sent, averaged over ranks):

    ring             2(p-1)/p·S                         per rank
    recursive dbl.   (p'·log2 p'·S + 2(p-p')·S) / p     (p' = largest power of two <= p)
    rabenseifner     (2(p'-1)·S + 2(p-p')·S) / p
    tree             2(p-1)·S / p                       (reduce up + broadcast down)
    hierarchical     2(q-1)/q·S + 2(m-1)/m·S/q          (m nodes of q ranks, ring inside each)
"""
import argparse
import json
import math
import os
import sys
import time

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mpi4py import MPI
import numpy as np  # the reference and the data generator run on the host

from minipar.backend import set_backend, sync, to_device, to_host
from minipar.comm import Communicator, abort_on_exception, all_reduce
from minipar.comm.bench import parse_size
from minipar.comm.chunks import pow2_floor
from minipar.comm.collectives import _auto


def textbook_bytes(algorithm, p, S, q):
    """Average bytes sent per rank for an all-reduce of S bytes over p ranks."""
    if p == 1:
        return 0.0
    p2, rem = pow2_floor(p), p - pow2_floor(p)
    if algorithm == "ring":
        return 2 * (p - 1) / p * S
    if algorithm == "recursive_doubling":
        return (p2 * math.log2(p2) * S + 2 * rem * S) / p
    if algorithm == "rabenseifner":
        return (2 * (p2 - 1) * S + 2 * rem * S) / p
    if algorithm == "tree":
        return 2 * (p - 1) * S / p
    if algorithm.startswith("hierarchical"):
        m = p // q
        return 2 * (q - 1) / q * S + 2 * (m - 1) / m * S / q
    raise ValueError(algorithm)


def rank_data(rank, n):
    return np.random.default_rng(rank).integers(-50, 50, size=n).astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    ap.add_argument("--sizes", default="4K,64K,1M", help="buffer sizes in bytes (K/M suffixes)")
    ap.add_argument("--ranks-per-node", type=int, default=2, help="pretend nodes of this many ranks")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the rows as JSON to FILE")
    args = ap.parse_args(argv)
    abort_on_exception()
    set_backend(args.backend)
    q = args.ranks_per_node
    comm = Communicator(check=True, ranks_per_node=q)
    p, r = comm.size, comm.rank
    algorithms = ["ring", "recursive_doubling", "rabenseifner", "tree", "auto"]
    if p % q == 0 and p > q:
        algorithms.insert(4, "hierarchical:ring")
    rows = []
    for S in (parse_size(s) for s in args.sizes.split(",")):
        n = S // 4
        want = np.sum([rank_data(k, n) for k in range(p)], axis=0)
        for alg in algorithms:
            x = to_device(rank_data(r, n))
            comm.reset_counters()
            all_reduce(comm, x, algorithm=alg)
            sent = comm.mpi.allreduce(comm.bytes_sent) / p
            ok = comm.mpi.allreduce(int(np.array_equal(to_host(x), want)))
            times = []
            for _ in range(args.reps):
                comm.mpi.Barrier()
                t0 = time.perf_counter()
                all_reduce(comm, x, algorithm=alg)
                sync()
                times.append(comm.mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            used = _auto(comm.context("coll"), x.nbytes) if alg == "auto" else alg
            rows.append(dict(algorithm=alg, chosen=used, size=S, correct=ok == p,
                             bytes_per_rank=sent, textbook=textbook_bytes(used, p, S, q),
                             time_s=float(np.median(times))))
    if r == 0:
        print(f"all-reduce on {p} ranks ({args.backend}), nodes of {q} ranks for hierarchical")
        print(f"{'algorithm':<30}{'size':>9}{'correct':>8}{'sent/rank':>12}{'textbook':>12}{'time us':>10}")
        for row in rows:
            name = row["algorithm"] + (f" ({row['chosen']})" if row["algorithm"] == "auto" else "")
            print(f"{name:<30}{row['size']:>9}{str(row['correct']):>8}{row['bytes_per_rank']:>12.0f}"
                  f"{row['textbook']:>12.0f}{row['time_s'] * 1e6:>10.1f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    if not all(row["correct"] for row in rows):
        raise SystemExit("some results differ from NumPy")


if __name__ == "__main__":
    main()
