"""Edge cases of the collectives, in one launch (run under mpiexec, check mode on).

    comm_edge.py [--sections strided,bits,overlap] [--repeats 20]

- strided: non-contiguous and oddly shaped inputs and ``out`` (0-d, 0-size, 1-D to 3-D,
  transposed, every other element) for every collective x algorithm, against NumPy;
- bits: replicas bit-identical for ±0, NaNs of every sign and payload and ±inf under
  sum/max/min, for every all-reduce algorithm (blocking and non-blocking), reduce_scatter
  + all_gather and broadcast;
- overlap: ``--repeats`` fresh communicators whose first use is a non-blocking and a
  blocking hierarchical all-reduce at the same time (some with a delay injected between
  them on odd ranks) — the interleaving that used to deadlock.
"""
import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

from comm_correctness import data, expect, ref_reduce
from minipar.comm import (ALL_REDUCE_ALGORITHMS, Communicator, abort_on_exception, all_gather,
                          all_reduce, all_reduce_async, broadcast, chunk_bounds, reduce,
                          reduce_scatter, set_hang_timeout)

ALGS = ("auto",) + ALL_REDUCE_ALGORITHMS + ("hierarchical:recursive_doubling",)


def strided(shape, dtype, fill=0):
    """A non-contiguous array of ``shape`` (every other element of a wider one)."""
    base = np.full(tuple(shape) + (2,), fill, dtype=dtype)
    return base[..., 0]


def transposed(shape, dtype):
    """A non-contiguous (transposed) array of ``shape``."""
    return np.zeros(shape[::-1], dtype=dtype).T


SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1, 13, 1)]


def check_strided(comm):
    p, r, n = comm.size, comm.rank, 0
    for shape in SHAPES:
        size = int(np.prod(shape))
        want = ref_reduce(p, size, np.float64, "sum").reshape(shape)
        for alg in ALGS:
            for make in (strided, transposed):
                out = make(shape, np.float64)
                x = data(r, size, np.float64).reshape(shape)
                got = all_reduce(comm, x, algorithm=alg, out=out)
                assert got is out
                expect(out, want, f"all_reduce {alg} out={make.__name__}{shape}")
                view = strided(shape, np.float64)
                view[...] = data(r, size, np.float64).reshape(shape)
                expect(all_reduce(comm, view, algorithm=alg), want, f"all_reduce {alg} strided {shape}")
                n += 2
        b = chunk_bounds(size, p)
        mine = b[r + 1] - b[r]
        for oshape in ((mine,), (1, mine), (mine, 1, 1)):
            for make in (strided, transposed):
                out = make(oshape, np.int32)
                x = strided((size,), np.int32)
                x[...] = data(r, size, np.int32)
                got = reduce_scatter(comm, x, op="max", out=out)
                assert got is out
                expect(out.reshape(-1), ref_reduce(p, size, np.int32, "max")[b[r]:b[r + 1]],
                       f"reduce_scatter out={make.__name__}{oshape} n={size}")
                n += 1
        full = np.concatenate([data(q, size, np.float32)[b[q]:b[q + 1]] for q in range(p)])
        for oshape in ((size,), (1, size), (size, 1, 1)) if size else ((0,),):
            for make in (strided, transposed):
                for sizes in (None, np.diff(b)):
                    out = make(oshape, np.float32)
                    shard = strided((mine,), np.float32)
                    shard[...] = data(r, size, np.float32)[b[r]:b[r + 1]]
                    got = all_gather(comm, shard, sizes=sizes, out=out)
                    assert got is out
                    expect(out.reshape(-1), full, f"all_gather out={make.__name__}{oshape}")
                    n += 1
        for root in sorted({0, p - 1}):
            for alg in ("binomial", "scatter_allgather", "auto"):
                x = transposed(shape, np.int64)
                x[...] = data(r if r == root else 99, size, np.int64).reshape(shape)
                broadcast(comm, x, root=root, algorithm=alg)
                expect(x, data(root, size, np.int64).reshape(shape), f"broadcast {alg} {shape}")
                n += 1
            for alg in ("binomial", "ring", "auto"):
                x = strided(shape, np.float32)
                x[...] = data(r, size, np.float32).reshape(shape)
                out = transposed(shape, np.float32)
                got = reduce(comm, x, root=root, out=out, algorithm=alg)
                if r == root:
                    assert got is out
                    expect(out, ref_reduce(p, size, np.float32, "sum").reshape(shape),
                           f"reduce {alg} {shape}")
                else:
                    assert got is None and not out.any()  # non-roots' out untouched
                n += 1
    return n


def special(dtype):
    """±0, ±inf, 1 and NaNs of both signs with different payloads, as ``dtype``."""
    bits = {np.float16: (np.uint16, [0x7E01, 0xFE02, 0x7C03, 0xFC04]),
            np.float32: (np.uint32, [0x7FC00001, 0xFFC00002, 0x7F800003, 0xFF800004]),
            np.float64: (np.uint64, [0x7FF8000000000001, 0xFFF8000000000002,
                                     0x7FF0000000000003, 0xFFF0000000000004])}[dtype]
    nans = np.array(bits[1], dtype=bits[0]).view(dtype)
    plain = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -0.0, 0.0], dtype=dtype)
    return np.concatenate([plain, nans])


def same_bits_everywhere(comm, x, what):
    views = comm.mpi.allgather(x.tobytes())
    if any(v != views[0] for v in views):
        diff = [q for q, v in enumerate(views) if v != views[0]]
        raise AssertionError(f"{what}: ranks {diff} hold other bits than rank 0")


def check_bits(comm, hier):
    p, r, n = comm.size, comm.rank, 0
    np.seterr(invalid="ignore", over="ignore")  # inf - inf is the point here
    for dtype in (np.float16, np.float32, np.float64):
        vals = special(dtype)
        rng = np.random.default_rng([7, r])
        for size in (1, 300):  # one element: NumPy's scalar loop; 300: every mixture
            for op in ("sum", "max", "min"):
                for alg in ALGS:
                    x = vals[rng.integers(0, vals.size, size)]
                    src = np.stack(comm.mpi.allgather(x))
                    c = hier if alg.startswith("hierarchical") else comm
                    all_reduce(c, x, op=op, algorithm=alg)
                    same_bits_everywhere(c, x, f"all_reduce {alg} {op} {dtype.__name__} n={size}")
                    with np.errstate(invalid="ignore"):  # the value is NumPy's (0 == -0)
                        want = {"sum": np.sum, "max": np.max, "min": np.min}[op](src, axis=0)
                    ok = (x == want) | (np.isnan(x) & np.isnan(want))
                    assert ok.all(), f"all_reduce {alg} {op}: {x[~ok][:4]} vs {want[~ok][:4]}"
                    n += 1
                    if "doubling" in alg or alg == "auto":  # the algorithms both partners compute
                        y = vals[rng.integers(0, vals.size, size)]
                        all_reduce_async(c, y, op=op, algorithm=alg).wait(timeout=60)
                        same_bits_everywhere(c, y, f"all_reduce_async {alg} {op}")
                        n += 1
                z = vals[rng.integers(0, vals.size, size)]
                full = all_gather(comm, reduce_scatter(comm, z, op=op))
                same_bits_everywhere(comm, full, f"reduce_scatter+all_gather {op}")
                broadcast(comm, z, root=p - 1)
                same_bits_everywhere(comm, z, "broadcast")
                n += 2
    return n


def check_overlap(repeats):
    """Fresh communicators, first used by a non-blocking and a blocking hierarchical
    all-reduce at once; a hang fails through the hang timeout (and the launch timeout).

    A delay is injected into every node-layout build — on the main thread of odd ranks,
    on any other thread of even ones — so the builds cross between ranks as in the
    reported deadlock; and no build may run off the main thread at all."""
    import threading

    import minipar.comm.collectives as coll_mod
    import minipar.comm.hierarchical as hier_mod
    import minipar.comm.nonblocking as nb_mod
    r = MPI.COMM_WORLD.Get_rank()
    build, off_main = hier_mod.node_layout, []

    def delayed(comm):
        main = threading.current_thread() is threading.main_thread()
        if ("nodes", comm.ranks_per_node) not in comm.cache:  # a build, not a cache hit
            if not main:
                off_main.append(threading.current_thread().name)
            if main == (r % 2 == 1):
                time.sleep(0.01)
        return build(comm)

    hier_mod.node_layout = coll_mod.node_layout = nb_mod.node_layout = delayed
    try:
        for i in range(repeats):
            c = Communicator(MPI.COMM_WORLD.Dup(), check=bool(i % 2), ranks_per_node=2)
            x, y = np.full(33, r + 1.0), np.full(17, r + 1.0)
            h = all_reduce_async(c, x, algorithm="hierarchical" if i % 3 else "auto")
            all_reduce(c, y, algorithm="hierarchical")
            h.wait(timeout=60)
            p = c.size
            assert np.all(x == p * (p + 1) / 2) and np.all(y == p * (p + 1) / 2)
    finally:
        hier_mod.node_layout = coll_mod.node_layout = nb_mod.node_layout = build
    assert not off_main, f"node layouts built off the main thread: {off_main[:3]}"
    return repeats


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="strided,bits,overlap")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    abort_on_exception()
    set_hang_timeout(20.0)  # a regression reports who waits for whom instead of hanging
    comm = Communicator(check=True)
    hier = Communicator(check=True, ranks_per_node=2 if comm.size % 3 else 3)
    n = 0
    sections = args.sections.split(",")
    if "strided" in sections:
        n += check_strided(comm)
    if "bits" in sections:
        n += check_bits(comm, hier)
    if "overlap" in sections:
        n += check_overlap(args.repeats)
    if comm.rank == 0:
        print(f"edge OK {n} cases on {comm.size} ranks")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
