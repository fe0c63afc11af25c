"""Lesson 04 — SPMD and collectives by hand: one program on every rank, point-to-point
messages, a deadlock, and every all-reduce algorithm checked, counted and timed.

    mpiexec -n 4 python lessons/04_collectives.py hello
    mpiexec -n 2 python lessons/04_collectives.py deadlock [--hang-timeout 2]
    mpiexec -n 3 python lessons/04_collectives.py exercise --file MINE.py --name ring_shift
        (or --name ring_reduce_scatter, recursive_doubling)
    mpiexec -n 4 python lessons/04_collectives.py algorithms [--sizes 4K,64K] [--ranks-per-node 2]
    mpiexec -n 2 python lessons/04_collectives.py model [--sizes 1K,...,4M] [--json FILE]

Every subcommand takes ``--backend numpy|cupy`` (buffers on the GPU with cupy).

``algorithms``: every rank all-reduces its own data with each algorithm, checks the result
against NumPy (each rank can recompute every other rank's input), and the traffic counters
are compared with the textbook volume (bytes sent, averaged over ranks):

    ring             2(p-1)/p·S                         per rank
    recursive dbl.   (p'·log2 p'·S + 2(p-p')·S) / p     (p' = largest power of two <= p)
    rabenseifner     (2(p'-1)·S + 2(p-p')·S) / p
    tree             2(p-1)·S / p                       (reduce up + broadcast down)
    hierarchical     2(q-1)/q·S + 2(m-1)/m·S/q          (m nodes of q ranks, ring inside each)

``model``: calibrates the α-β-γ constants (``perf/calibrate_links.calibrate``, an explicit collective
call, three times: the model takes the medians), then times each algorithm, MPI's own Allreduce and (on 2 ranks) one bare exchange,
in turns, and writes the measured medians beside the model's predictions.
"""
import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mpi4py import MPI
import numpy as np  # the reference and the data generator run on the host

from minipar.backend import set_backend, sync, to_device, to_host, xp
from minipar.comm import Communicator, abort_on_exception, all_reduce, cost_model
from minipar.perf.calibrate_links import calibrate
from minipar.comm.bench import parse_size
from minipar.comm.collectives import _auto

from collectives_checks import EXERCISES, load, rank_data, say, textbook_bytes  # this folder


# ------------------------------------------------------------------ SPMD
def hello(args):
    comm = Communicator()
    r, p = comm.rank, comm.size
    print(f"rank {r} of {p}: pid {os.getpid()}", flush=True)   # every rank prints
    comm.mpi.Barrier()
    # point to point: rank 0 sends, rank 1 receives; the others skip this block
    if r == 0:
        comm.send(to_device(np.arange(4, dtype=np.float32) * 10), dest=1)
        print(f"rank 0 sent 4 floats to rank 1: {comm.bytes_sent} bytes, {comm.msgs_sent} message",
              flush=True)
    elif r == 1:
        got = comm.recv(to_device(np.zeros(4, dtype=np.float32)), source=0)
        print(f"rank 1 received {to_host(got).tolist()} from rank 0", flush=True)


def deadlock(args):
    """Both ranks send first, then receive, at growing sizes, until it hangs: below MPI's
    eager limit a send returns once the message is buffered; above it, a send waits for
    the matching receive — which the other rank, itself stuck in its send, never posts.
    The hang timeout turns the hang into an error that names the call and the peer."""
    comm = Communicator(hang_timeout=args.hang_timeout)
    peer = 1 - comm.rank
    n = 1 << 10
    while n <= 1 << 24:
        a, b = to_device(np.ones(n, np.uint8)), to_device(np.zeros(n, np.uint8))
        comm.mpi.Barrier()    # both ranks arrive: any wait below is the protocol's
        comm.send(a, peer)
        comm.recv(b, peer)
        say(comm, f"{n} bytes: both ranks sent first, then received: completed")
        n *= 2


# ------------------------------------------------------------------ exercises
def exercise(args):
    comm = Communicator(hang_timeout=args.hang_timeout)
    fn = load(args.file, args.name)
    try:
        EXERCISES[args.name](comm, fn)
    except (NotImplementedError, AssertionError) as err:
        print(f"rank {comm.rank}: {type(err).__name__}: {err}", flush=True)
        time.sleep(0.2)    # a moment for mpiexec to forward that line before the abort
        comm.mpi.Abort(1)


# ------------------------------------------------------------------ all-reduce algorithms
def algorithms(args):
    q = args.ranks_per_node
    comm = Communicator(check=True, ranks_per_node=q)
    p, r = comm.size, comm.rank
    names = ["ring", "recursive_doubling", "rabenseifner", "tree", "auto"]
    if p % q == 0 and p > q:
        names.insert(4, "hierarchical:ring")
    rows = []
    for S in (parse_size(s) for s in args.sizes.split(",")):
        n = S // 4
        want = np.sum([rank_data(k, n) for k in range(p)], axis=0)
        for alg in names:
            x = to_device(rank_data(r, n))
            comm.reset_counters()
            all_reduce(comm, x, algorithm=alg)
            sent = comm.mpi.allreduce(comm.bytes_sent) / p
            ok = comm.mpi.allreduce(int(np.array_equal(to_host(x), want)))
            used = _auto(comm.context("coll"), x.nbytes) if alg == "auto" else alg
            rows.append(dict(algorithm=alg, chosen=used, size=S, correct=ok == p,
                             bytes_per_rank=sent, textbook=textbook_bytes(used, p, S, q)))
    say(comm, f"all-reduce on {p} ranks ({args.backend}), nodes of {q} ranks for hierarchical")
    say(comm, f"{'algorithm':<34}{'size':>7}{'correct':>8}{'sent/rank':>11}{'textbook':>11}")
    for row in rows:
        name = row["algorithm"] + (f" ({row['chosen']})" if row["algorithm"] == "auto" else "")
        say(comm, f"{name:<34}{row['size']:>7}{str(row['correct']):>8}"
                  f"{row['bytes_per_rank']:>11.0f}{row['textbook']:>11.0f}")
    if args.json and r == 0:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not all(row["correct"] for row in rows):
        raise SystemExit("some results differ from NumPy")


# ------------------------------------------------------------------ the cost model, measured
MEASURED = ("alpha", "beta", "gamma", "gamma_shared", "beta_large", "gamma_large")


def model(args):
    comm = Communicator()
    ctx = comm.context("coll")             # the collectives' own communicator
    # collective: α, β, β_large, γ, γ_large, γ_shared — a few times, to see how much they move
    calibrations = [calibrate(ctx) for _ in range(args.calibrations)]
    c = dataclasses.replace(calibrations[0], **{
        k: statistics.median(getattr(x, k) for x in calibrations) for k in MEASURED})
    cost_model.use(ctx, c)                 # and "auto" now chooses by these constants
    p = comm.size
    names = ["ring", "recursive_doubling", "rabenseifner", "tree"]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    base = to_device(np.ones(max(sizes) // 4, dtype=np.float32))
    rows = []
    for S in sizes:
        buf = base[: S // 4]
        runs = [(a, lambda a=a: all_reduce(comm, buf, algorithm=a)) for a in names]
        if not hasattr(buf, "get"):        # MPI's own Allreduce, on host memory
            runs.append(("mpi", lambda: comm.mpi.Allreduce(MPI.IN_PLACE, buf)))
        if p == 2:                         # one bare message each way: the model's α + S·β
            scratch = xp.empty_like(buf)
            runs.append(("exchange", lambda: comm.sendrecv(buf, 1 - comm.rank, scratch, 1 - comm.rank)))
        rounds = max(5, min(args.rounds, int(args.budget / max(S * 4e-9, 1e-6))))
        times = np.zeros((len(runs), rounds + 1))
        for i in range(rounds + 1):        # round 0 warms up (workspaces, page faults)
            for k, (_, fn) in enumerate(runs):   # in turns: a load burst hits all alike
                buf.fill(1)                # as after a backward: freshly written gradients
                comm.mpi.Barrier()
                t0 = time.perf_counter()
                fn()
                sync()
                times[k, i] = time.perf_counter() - t0
        comm.mpi.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)   # a collective ends with its slowest rank
        for (name, _), row in zip(runs, times[:, 1:]):
            predicted = {"mpi": None, "exchange": c.alpha + S * cost_model.beta_of(c, S)}
            rows.append(dict(algorithm=name, size=S, time_s=statistics.median(row),
                             predicted_s=predicted[name] if name in predicted
                             else cost_model.predict(name, p, S, c),
                             model_choice=cost_model.choose(p, S, c)))
    if comm.rank == 0:
        out = dict(nprocs=p, params=c.to_dict(), calibrations=[x.to_dict() for x in calibrations],
                   rows=rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        print(f"calibrated {len(calibrations)} times on {p} ranks, medians: "
              f"α {c.alpha * 1e6:.1f} µs, β {1 / c.beta / 1e9:.2f} GB/s "
              f"(beyond {c.cache_bytes / 2**20:.0f} MiB {1 / c.beta_large / 1e9:.2f}), "
              f"γ {1 / c.gamma / 1e9:.1f} GB/s (beyond: {1 / c.gamma_large / 1e9:.1f}; "
              f"into a buffer just sent: {1 / c.gamma_shared / 1e9:.1f})")

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)
    parts = {}
    for name, fn in [("hello", hello), ("deadlock", deadlock), ("exercise", exercise),
                     ("algorithms", algorithms), ("model", model)]:
        parts[name] = sub.add_parser(name, help=fn.__doc__.split("\n")[0] if fn.__doc__ else name)
        parts[name].add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
        parts[name].set_defaults(run=fn)
    parts["deadlock"].add_argument("--hang-timeout", type=float, default=2.0)
    parts["exercise"].add_argument("--file", required=True, help="the learner's functions")
    parts["exercise"].add_argument("--name", required=True, choices=sorted(EXERCISES))
    parts["exercise"].add_argument("--hang-timeout", type=float, default=10.0)
    parts["algorithms"].add_argument("--sizes", default="4K,64K,1M", help="bytes (K/M suffixes)")
    parts["algorithms"].add_argument("--ranks-per-node", type=int, default=2,
                                     help="pretend nodes of this many ranks")
    parts["algorithms"].add_argument("--json", default=None, help="write the rows to FILE")
    parts["model"].add_argument("--sizes", default="1K,4K,16K,64K,256K,1M,4M")
    parts["model"].add_argument("--calibrations", type=int, default=3,
                                help="calibrate this many times; the model uses the medians")
    parts["model"].add_argument("--rounds", type=int, default=25, help="timed rounds at most")
    parts["model"].add_argument("--budget", type=float, default=0.25,
                                help="seconds per size and algorithm, roughly")
    parts["model"].add_argument("--json", default=None, help="write params and rows to FILE")
    args = ap.parse_args(argv)
    set_backend(args.backend)
    if args.part != "deadlock":            # the deadlock demo ends by its own hang timeout
        abort_on_exception()
    args.run(args)


if __name__ == "__main__":
    main()
