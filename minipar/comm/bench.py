"""Collective benchmark: every hand-written algorithm against MPI's own collective.

    mpiexec -n N python -m minipar bench comm [--min-size 1K] [--max-size 64M] [--json FILE]
    mpiexec -n N python -m minipar.comm.bench ...            (the same)
    mpiexec -n N python -m minipar bench comm --collective all_to_all ...

For each size S (powers of 4 from 1 KiB to 64 MiB by default) and algorithm, the time
of one in-place all-reduce is the slowest rank's, after a barrier; the algorithms take
turns, round after round (fair on a loaded machine); the table shows the median over
the rounds and the nccl-tests bandwidths

    algbw = S / t          busbw = algbw · 2(n-1)/n

(busbw is what each rank's link must carry, comparable across n), the α-β-γ model's
prediction, and ``vs MPI`` = t_MPI / t (above 1: faster than MPI's Allreduce).  With
``--backend cupy --transport nccl`` (a GPU per rank) the algorithms run over NCCL's
point-to-point calls and NCCL's own all-reduce is timed beside them: ``% of NCCL`` =
100·t_NCCL / t.  Where
calibration found a shaped link between nodes (a burst), every rank sleeps 2·B·β before
each call, so each starts on an idle link as the model assumes (``comm/two_level.py``).

With ``--collective all_to_all`` the size S is what each rank sends, S/p to every rank
(itself included), and the baselines are MPI's ``Alltoallv`` with the same counts
(``mpi``: the counts known beforehand) and MPI's ``Alltoall`` of the counts followed by
its ``Alltoallv`` (``mpi+counts``: the same work as ``all_to_all``, which exchanges its
counts first); ``vs MPI`` compares with ``mpi``.  busbw = algbw · (n-1)/n (the share of S
that leaves the rank).

    mpiexec -n N python -m minipar bench comm --check-overhead [--max-size 64K]

measures instead what check mode (``MINIPAR_COMM_CHECK=1``) costs per call: the same
collectives on two communicators, check off and on, timed in alternation in one run;
the difference is the descriptor agreement of ``agree.py``.

A command on top of ``comm``, not one of its layers: nothing in minipar but the CLI
imports it, so it may calibrate with ``perf/calibrate_links.py`` (``perf`` builds on
``comm``; ``tests/test_imports.py`` counts a module only the CLI imports as a layer of
its own).
"""
from __future__ import annotations

import json
import statistics
import time

import numpy  # host metadata (the counts) only
from mpi4py import MPI

from minipar.cli_checks import CommandError, OneLineParser, at_least, output_file, positive
from minipar.backend import set_backend, sync, xp
from minipar.comm import alltoall, cost_model, two_level
from minipar.comm.chunks import chunk_sizes
from minipar.comm.collectives import (ALL_REDUCE_ALGORITHMS, ALL_TO_ALL_ALGORITHMS, _auto,
                                      all_gather, all_reduce, all_to_all, barrier)
from minipar.comm.communicator import Communicator
from minipar.comm.nodes import spans_nodes
from minipar.perf.calibrate_links import calibrate
from minipar.process.devices import choose_device

_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("IB").rstrip("B")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


def fmt_size(n: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return f"{n}B"


def _time_interleaved(comm, fns, budget, max_iters, refill=None, idle_s=0.0):
    """Median (and min) over rounds of the slowest rank's time, for each of ``fns``.

    Each round times every function once, in turn, so a load burst on a shared machine
    hits all of them alike instead of whichever was running at the time.  ``refill``
    (untimed, before each call) rewrites the buffer, so every contender starts from the
    same cache state — the one of a training step, whose gradients were just written by
    backward — rather than from whatever its predecessor in the round left (at 64 KiB
    on 2 ranks that alone moved a ring all-reduce between 23 and 42 µs).  ``idle_s``
    (before each call's barrier) does the same for a shaped link's burst credit
    (``two_level.refill_seconds``): on the simulated cluster a tree all-reduce of 1 MiB
    found 3.3 ms of idle link after a ring, and a full burst after another tree.
    """
    for fn in fns:  # warm-up: connections, workspaces, page faults, the cost model
        fn()
    comm.mpi.Barrier()
    t0 = time.perf_counter()
    for fn in fns:
        fn()
    sync()
    first = comm.mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    rounds = int(max(3, min(max_iters, budget / max(first, 1e-9))))
    times = xp.zeros((len(fns), rounds), dtype=xp.float64)
    for i in range(rounds):
        for k, fn in enumerate(fns):
            if refill is not None:
                refill()
            if idle_s:
                time.sleep(idle_s)
            comm.mpi.Barrier()
            t0 = time.perf_counter()
            fn()
            sync()
            times[k, i] = time.perf_counter() - t0
    host = times.get() if hasattr(times, "get") else times
    comm.mpi.Allreduce(MPI.IN_PLACE, host, op=MPI.MAX)
    return [(statistics.median(row), min(row)) for row in host.tolist()]


def run(comm, sizes, algorithms, dtype="float32", budget=1.0, max_iters=200):
    """Rows of measurements (one per size and algorithm, "mpi" being the baseline)."""
    p = comm.size
    itemsize = xp.dtype(dtype).itemsize
    base = xp.zeros(max(sizes) // itemsize, dtype=dtype)
    ctx = comm.context("coll")
    params = calibrate(ctx)                   # explicit and collective: the model's constants
    cost_model.use(ctx, params)               # ... and "auto" chooses by them (the model's
                                              # choice is what this benchmark checks)
    idle_s = two_level.refill_seconds(params)   # a shaped link starts each call idle
    rows = []
    for size in sizes:
        buf = base[: size // itemsize]
        names, fns = [], []
        if not hasattr(buf, "get"):  # MPI's own, on host memory
            names.append("mpi")
            fns.append(lambda: comm.mpi.Allreduce(MPI.IN_PLACE, buf))
        if comm.transport == "nccl":  # NCCL's own, on the same GPUs
            names.append("nccl")
            fns.append(lambda: comm.path.all_reduce(buf))
        for alg in algorithms:
            names.append(alg)
            fns.append(lambda a=alg: all_reduce(comm, buf, "sum", a))
        timed = dict(zip(names, _time_interleaved(comm, fns, budget, max_iters,
                                                  refill=lambda: buf.fill(1), idle_s=idle_s)))
        t_mpi = timed.get("mpi", (float("nan"),))[0]
        t_nccl = timed.get("nccl", (float("nan"),))[0]
        for alg in names:
            t, t_min = timed[alg]
            used = _auto(ctx, buf.nbytes) if alg == "auto" else alg
            algbw = size / t / 1e9 if t > 0 else float("inf")
            pred = None if used in ("mpi", "nccl") else cost_model.predict(used, p, size, params,
                                                                           comm.ranks_per_node)
            rows.append(dict(size=size, algorithm=alg, chosen=used, time_s=t, min_time_s=t_min,
                             algbw_GBps=algbw, busbw_GBps=algbw * (2 * (p - 1) / p if p > 1 else 1.0),
                             predicted_s=pred, vs_mpi=t_mpi / t if t > 0 else float("nan"),
                             pct_of_nccl=100 * t_nccl / t if t > 0 else float("nan"),
                             nprocs=p, dtype=dtype))
    return rows, params


def run_all_to_all(comm, sizes, algorithms, dtype="float32", budget=1.0, max_iters=200):
    """Rows of measurements of all_to_all, each rank sending ``size`` bytes (array_split
    of its elements over the ranks: every rank the same counts), against MPI's
    ``Alltoallv`` ("mpi") and ``Alltoall`` of the counts + ``Alltoallv`` ("mpi+counts")."""
    p, r = comm.size, comm.rank
    itemsize = xp.dtype(dtype).itemsize
    ctx = comm.context("coll")
    params = calibrate(ctx)
    cost_model.use(ctx, params)
    idle_s = two_level.refill_seconds(params)
    base = xp.zeros(max(sizes) // itemsize, dtype=dtype)
    rows = []
    for size in sizes:
        send = base[: size // itemsize]
        counts = chunk_sizes(send.size, p)
        matrix = [counts] * p
        recv = xp.empty(p * counts[r], dtype=dtype)
        names, fns = [], []
        if not hasattr(send, "get"):  # MPI's own, on host memory
            sent = numpy.array(counts, dtype=numpy.int64) * itemsize
            got = numpy.full(p, counts[r] * itemsize, dtype=numpy.int64)
            spec_send = [send, (sent, numpy.cumsum(sent) - sent), MPI.BYTE]
            spec_recv = [recv, (got, numpy.cumsum(got) - got), MPI.BYTE]
            own, theirs = numpy.array(counts, dtype=numpy.int64), numpy.empty(p, numpy.int64)

            def mpi_counts_first():
                comm.mpi.Alltoall(own, theirs)
                comm.mpi.Alltoallv(spec_send, spec_recv)
            names += ["mpi", "mpi+counts"]
            fns += [lambda: comm.mpi.Alltoallv(spec_send, spec_recv), mpi_counts_first]
        for alg in algorithms:
            names.append(alg)
            fns.append(lambda a=alg: all_to_all(comm, send, counts, out=recv, algorithm=a))
        timed = dict(zip(names, _time_interleaved(comm, fns, budget, max_iters,
                                                  refill=lambda: send.fill(1), idle_s=idle_s)))
        t_mpi = timed.get("mpi", (float("nan"),))[0]
        for alg in names:
            t, t_min = timed[alg]
            used = alltoall.choose(ctx, matrix, itemsize, params) if alg == "auto" else alg
            algbw = size / t / 1e9 if t > 0 else float("inf")
            pred = None if used.startswith("mpi") else cost_model.predict_all_to_all(
                used, p, size, params, comm.ranks_per_node)
            rows.append(dict(collective="all_to_all", size=size, algorithm=alg, chosen=used,
                             time_s=t, min_time_s=t_min, algbw_GBps=algbw,
                             busbw_GBps=algbw * (p - 1) / p if p > 1 else algbw,
                             predicted_s=pred, vs_mpi=t_mpi / t if t > 0 else float("nan"),
                             nprocs=p, dtype=dtype))
    return rows, params


def check_overhead(mpi_comm, sizes, dtype="float32", budget=1.0, max_iters=500):
    """Rows: per-call time of all_reduce (auto), all_gather and barrier, check off vs on."""
    off = Communicator(mpi_comm, check=False)
    on = Communicator(mpi_comm, check=True)
    itemsize = xp.dtype(dtype).itemsize
    rows = []
    cases = [("barrier", 0, lambda c, b: barrier(c))]
    for size in sizes:
        cases.append(("all_reduce", size, lambda c, b: all_reduce(c, b, op="max")))
        cases.append(("all_gather", size, lambda c, b: all_gather(
            c, b[: b.size // c.size], sizes=[b.size // c.size] * c.size)))
    for name, size, fn in cases:
        bufs = [xp.ones(max(size // itemsize, 1), dtype=dtype) for _ in (0, 1)]
        (t_off, _), (t_on, _) = _time_interleaved(
            off, [lambda: fn(off, bufs[0]), lambda: fn(on, bufs[1])], budget, max_iters)
        rows.append(dict(collective=name, size=size, off_s=t_off, on_s=t_on,
                         overhead_s=t_on - t_off, nprocs=off.size))
    return rows


def print_check_overhead(rows, p):
    print(f"# check mode (MINIPAR_COMM_CHECK=1) cost per call, {p} ranks, median of rounds")
    print(f"{'collective':<12} {'size':>6} {'check off us':>13} {'check on us':>12} "
          f"{'overhead us':>12} {'ratio':>6}")
    for r in rows:
        ratio = r["on_s"] / r["off_s"] if r["off_s"] > 0 else float("nan")
        print(f"{r['collective']:<12} {fmt_size(r['size']) if r['size'] else '-':>6} "
              f"{r['off_s'] * 1e6:13.1f} {r['on_s'] * 1e6:12.1f} {r['overhead_s'] * 1e6:12.1f} "
              f"{ratio:6.2f}")


def print_table(rows, params, p, collective="all_reduce"):
    what = ("all-reduce" if collective == "all_reduce" else
            "all-to-all (size: what each rank sends, size/p to every rank)")
    print(f"# {what}, {p} ranks, α={params.alpha * 1e6:.2f} µs, "
          f"1/β={1 / params.beta / 1e9:.2f} GB/s, 1/γ={1 / params.gamma / 1e9:.2f} GB/s, "
          f"1/γ_shared={1 / (params.gamma_shared or params.gamma) / 1e9:.2f} GB/s (calibrated)")
    if params.alpha_inter is not None:
        print(f"# between nodes of {params.ranks_per_node} ranks: α={params.alpha_inter * 1e6:.1f} µs, "
              f"1/β={1 / params.beta_inter / 1e9:.3f} GB/s, burst {params.burst_inter / 1e3:.0f} kB "
              f"(calibrated; the model prices each "
              f"step by the link it crosses, comm/two_level.py)")
    nccl = any(r["algorithm"] == "nccl" for r in rows)   # the baseline: NCCL's, not MPI's
    print(f"{'size':>6} {'algorithm':<28} {'time us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} "
          f"{'model us':>9} " + (f"{'% of NCCL':>9}" if nccl else f"{'vs MPI':>7}"))
    for r in rows:
        name = r["algorithm"] if r["algorithm"] != "auto" else f"auto({r['chosen']})"
        model = "-" if r["predicted_s"] is None else f"{r['predicted_s'] * 1e6:9.1f}"
        print(f"{fmt_size(r['size']):>6} {name:<28} {r['time_s'] * 1e6:10.1f} {r['algbw_GBps']:10.3f} "
              f"{r['busbw_GBps']:10.3f} {model:>9} " +
              (f"{r['pct_of_nccl']:9.0f}" if nccl else f"{r['vs_mpi']:7.2f}"))


# per rank: input, output and the algorithm's scratch — two for some all-reduces; the
# two-level all-to-all packs its rows twice
BUFFERS_PER_SIZE = {"all_reduce": 4, "all_to_all": 5}


def algorithms_of(collective):
    """The names ``--algorithms`` takes for ``collective`` ("auto" first)."""
    return ("auto",) + (ALL_REDUCE_ALGORITHMS if collective == "all_reduce" else ALL_TO_ALL_ALGORITHMS)


def check_bench_flags(args):
    """(smallest, largest) buffer in bytes, or CommandError in one line before any message:
    a size that is not one, sizes out of order, a step that never grows, an unknown
    algorithm or dtype, a largest size this rank's memory cannot hold, an unwritable --json."""
    from minipar.observe.resources import memory_budget_bytes
    sizes = []
    for flag, text in (("--min-size", args.min_size), ("--max-size", args.max_size)):
        try:
            sizes.append(parse_size(text))
        except ValueError:
            raise CommandError(f"{flag} {text!r} is not a size (bytes, or with K, M, G: 64K)") from None
        at_least(flag, sizes[-1], 1)
    lo, hi = sizes
    if lo > hi:
        raise CommandError(f"--min-size {args.min_size} is larger than --max-size {args.max_size}")
    at_least("--factor", args.factor, 2)
    at_least("--max-iters", args.max_iters, 1)
    at_least("--ranks-per-node", args.ranks_per_node, 1)
    positive("--budget", args.budget)
    if args.check_overhead and args.collective != "all_reduce":
        raise CommandError("--check-overhead times all_reduce, all_gather and barrier; "
                           f"leave out --collective {args.collective}")
    known = algorithms_of(args.collective)
    names = args.algorithms if args.algorithms is not None else ",".join(known)
    unknown = [a for a in names.split(",") if a and a not in known]
    if unknown or not names.strip(","):
        raise CommandError(f"--algorithms: unknown {unknown[0]!r}; choose from "
                           f"{', '.join(known)}" if unknown else
                           "--algorithms is empty; name at least one")
    try:
        kind = xp.dtype(args.dtype).kind
    except TypeError:
        kind = None
    if kind not in ("f", "i", "u"):
        raise CommandError(f"--dtype {args.dtype!r} is not a numeric dtype (float32, float64, int32, ...)")
    budget, buffers = memory_budget_bytes(), BUFFERS_PER_SIZE[args.collective]
    if budget and buffers * hi > budget:
        raise CommandError(f"--max-size {args.max_size} needs about {buffers * hi / 2 ** 30:.1f} "
                           f"GiB per rank ({buffers} buffers); a rank may use "
                           f"{budget / 2 ** 30:.1f} GiB")
    output_file("--json", args.json)
    return lo, hi


def main(argv=None):
    ap = OneLineParser(prog="minipar bench comm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-size", default="1K", help="smallest buffer (default 1K)")
    ap.add_argument("--max-size", default="64M", help="largest buffer (default 64M)")
    ap.add_argument("--factor", type=int, default=4, help="size step (default x4)")
    ap.add_argument("--collective", default="all_reduce", choices=("all_reduce", "all_to_all"),
                    help="the collective to time (default all_reduce)")
    ap.add_argument("--algorithms", default=None,
                    help="comma-separated algorithms of the collective (default: all and auto; "
                         "all_to_all's two_level where the group spans nodes)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per size (all algorithms)")
    ap.add_argument("--max-iters", type=int, default=200)
    ap.add_argument("--ranks-per-node", type=int, default=None,
                    help="pretend nodes of this many ranks (hierarchical)")
    ap.add_argument("--backend", default="numpy", choices=("numpy", "cupy"))
    ap.add_argument("--transport", default=None, help="cupy: how device arrays travel "
                    "(auto, staging, cuda-aware, pageable, nccl: NCCL's all-reduce as the "
                    "baseline; default $MINIPAR_TRANSPORT or auto)")
    ap.add_argument("--json", default=None, help="write the rows as JSON to FILE")
    ap.add_argument("--check-overhead", action="store_true",
                    help="measure check mode's cost per call instead (sizes up to --max-size)")
    args = ap.parse_args(argv)
    lo, hi = check_bench_flags(args)
    try:
        set_backend(args.backend)
    except RuntimeError as err:
        raise CommandError(f"--backend {args.backend}: {err}") from None
    if args.check_overhead:
        sizes = [8] + [s for s in (1 << 10, 64 << 10, 1 << 20) if s <= hi]
        rows = check_overhead(MPI.COMM_WORLD, sizes, args.dtype, args.budget, args.max_iters)
        if MPI.COMM_WORLD.Get_rank() == 0:
            print_check_overhead(rows, MPI.COMM_WORLD.Get_size())
        return 0
    try:   # a GPU per rank where there are enough (NCCL insists), shared where not
        choose_device(MPI.COMM_WORLD, share=args.transport != "nccl")
        comm = Communicator(check=False, transport=args.transport,
                            ranks_per_node=args.ranks_per_node)
    except ValueError as err:
        raise CommandError(f"--transport {args.transport}: {err}") from None
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= args.factor
    names = args.algorithms if args.algorithms is not None else ",".join(algorithms_of(args.collective))
    algorithms = [a for a in names.split(",") if a]
    if args.algorithms is None and args.collective == "all_to_all" and \
            not spans_nodes(comm.context("coll")):
        algorithms.remove("two_level")      # on one node it is the pairwise exchange
    measure = run if args.collective == "all_reduce" else run_all_to_all
    rows, params = measure(comm, sizes, algorithms, args.dtype, args.budget, args.max_iters)
    if comm.rank == 0:
        print_table(rows, params, comm.size, args.collective)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"nprocs": comm.size, "cost_params": params.to_dict(),
                           "alpha": params.alpha, "beta": params.beta, "gamma": params.gamma,
                           "gamma_shared": params.gamma_shared, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
