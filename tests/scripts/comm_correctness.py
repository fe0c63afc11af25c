"""Many collective cases in one mpiexec launch, each checked against NumPy on every rank.

Every rank can compute every other rank's input (seeded by rank), so the reference
needs no communication.  Integer-valued data keep float16 sums exact.
Prints "OK <n> cases" on rank 0; any mismatch raises (and the job aborts).
"""
import argparse
import sys

import numpy as np

from minipar.comm import (ALL_REDUCE_ALGORITHMS, Communicator, abort_on_exception, all_gather,
                          all_reduce, all_reduce_async, barrier, broadcast, chunk_bounds, reduce,
                          reduce_scatter)

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
REF = {"sum": np.sum, "max": np.max, "min": np.min}


def data(rank, n, dtype, seed=0):
    rng = np.random.default_rng([seed, rank, n])
    return rng.integers(-8, 9, size=n).astype(dtype)


def ref_reduce(p, n, dtype, op, seed=0):
    stack = np.stack([data(r, n, dtype, seed) for r in range(p)]) if n else np.zeros((p, 0), dtype)
    return REF[op](stack, axis=0).astype(dtype) if n else np.zeros(0, dtype)


def expect(got, want, what):
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        raise AssertionError(f"{what}: got {got[:8]}... ({got.dtype}{got.shape}) "
                             f"want {want[:8]}... ({want.dtype}{want.shape})")


def check_all_reduce(comm, sizes, big, algorithms, tag="", full_sizes=None):
    p, r, n_cases = comm.size, comm.rank, 0
    full = [(d, op) for d in DTYPES for op in ("sum", "max", "min")]
    full_sizes = (p + 1, 13) if full_sizes is None else full_sizes
    for alg in algorithms:
        for i, n in enumerate(sizes):
            # every dtype x op on full_sizes; the other sizes rotate through the combinations
            combos = full if n in full_sizes else [full[(3 * i + j) % len(full)] for j in range(3)]
            for dtype, op in combos:
                x = data(r, n, dtype)
                all_reduce(comm, x, op=op, algorithm=alg)
                expect(x, ref_reduce(p, n, dtype, op), f"{tag}all_reduce {alg} n={n} {dtype.__name__} {op}")
                n_cases += 1
        # out of place, 2-D, and non-contiguous input
        x = data(r, 60, np.float32).reshape(6, 10)
        keep = x.copy()
        out = np.empty_like(x)
        all_reduce(comm, x, algorithm=alg, out=out)
        expect(out, ref_reduce(p, 60, np.float32, "sum").reshape(6, 10), f"{tag}{alg} out-of-place")
        expect(x, keep, f"{tag}{alg} out-of-place leaves input")
        y = data(r, 60, np.float64).reshape(6, 10)
        view = y[:, ::2]
        want = ref_reduce(p, 60, np.float64, "max").reshape(6, 10)[:, ::2]
        all_reduce(comm, view, op="max", algorithm=alg)
        expect(np.ascontiguousarray(view), want, f"{tag}{alg} non-contiguous")
        n_cases += 2
        if big:  # several MiB
            x = data(r, big, np.float32)
            all_reduce(comm, x, algorithm=alg)
            expect(x, ref_reduce(p, big, np.float32, "sum"), f"{tag}{alg} big n={big}")
            n_cases += 1
    return n_cases


def check_others(comm, sizes, tag=""):
    p, r, n_cases = comm.size, comm.rank, 0
    for n in sizes:
        b = chunk_bounds(n, p)
        for dtype, op in ((np.float16, "sum"), (np.float64, "max"), (np.int32, "min")):
            x = data(r, n, dtype)
            keep = x.copy()
            shard = reduce_scatter(comm, x, op=op)
            expect(shard, ref_reduce(p, n, dtype, op)[b[r]:b[r + 1]], f"{tag}reduce_scatter n={n} {op}")
            expect(x, keep, f"{tag}reduce_scatter leaves input")
            n_cases += 1
            full = np.concatenate([data(q, n, dtype)[chunk_bounds(n, p)[q]:chunk_bounds(n, p)[q + 1]]
                                   for q in range(p)])
            mine = data(r, n, dtype)[b[r]:b[r + 1]]
            expect(all_gather(comm, mine, sizes=np.diff(b)), full, f"{tag}all_gather n={n}")
            expect(all_gather(comm, mine), full, f"{tag}all_gather n={n} sizes exchanged")
            n_cases += 2
        for root in sorted({0, p - 1, p // 2}):
            for alg in ("binomial", "scatter_allgather", "auto"):
                x = data(r, n, np.float32) if r == root else np.zeros(n, np.float32)
                broadcast(comm, x, root=root, algorithm=alg)
                expect(x, data(root, n, np.float32), f"{tag}broadcast {alg} n={n} root={root}")
                n_cases += 1
            for alg in ("binomial", "ring", "auto"):
                x = data(r, n, np.int64)
                keep = x.copy()
                res = reduce(comm, x, root=root, op="sum", algorithm=alg)
                if r == root:
                    expect(res, ref_reduce(p, n, np.int64, "sum"), f"{tag}reduce {alg} n={n} root={root}")
                else:
                    assert res is None
                    expect(x, keep, f"{tag}reduce leaves non-root input")
                n_cases += 1
    # uneven all_gather: rank r contributes r+1 elements
    mine = np.full(r + 1, r, dtype=np.float32)
    want = np.concatenate([np.full(q + 1, q, np.float32) for q in range(p)])
    expect(all_gather(comm, mine), want, f"{tag}all_gather uneven")
    barrier(comm)
    comm.barrier()
    return n_cases + 1


def check_async(comm):
    p, r = comm.size, comm.rank
    hs, want = [], []
    for i, alg in enumerate(("ring", "recursive_doubling", "auto")):
        x = data(r, 1000 + i, np.float32)
        hs.append((all_reduce_async(comm, x, algorithm=alg), x))
        want.append(ref_reduce(p, 1000 + i, np.float32, "sum"))
    for (h, x), w in zip(hs, want):
        got = h.wait(timeout=60)
        assert got is x and h.test()
        expect(x, w, "all_reduce_async")
    return len(hs)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--big", type=int, default=0, help="elements of the several-MiB case")
    ap.add_argument("--sections", default="all_reduce,others,async,split,hier")
    ap.add_argument("--lite", action="store_true", help="fewer sizes (for many oversubscribed ranks)")
    args = ap.parse_args(argv)
    abort_on_exception()
    comm = Communicator(check=True)
    p = comm.size
    if args.lite:
        sizes, full_sizes = sorted({0, 1, max(p - 1, 0), p + 1, 1031}), (p + 1,)
    else:
        sizes, full_sizes = sorted({0, 1, max(p - 1, 0), p + 1, 7, 13, 31, 257, 1031}), None
    sections = args.sections.split(",")
    n = 0
    if "all_reduce" in sections:
        n += check_all_reduce(comm, sizes, args.big, ("auto",) + ALL_REDUCE_ALGORITHMS,
                              full_sizes=full_sizes)
    if "others" in sections:
        n += check_others(comm, sizes if not args.lite else [0, 1, p + 1, 31])
    if "async" in sections:
        n += check_async(comm)
    if "split" in sections and p > 1:  # sub-communicators: even/odd ranks, reversed order
        sub = comm.split(comm.rank % 2, key=-comm.rank)
        assert sub.size == (p + 1 - comm.rank % 2) // 2 and sub.rank == (sub.size - 1 - comm.rank // 2)
        n += check_all_reduce(sub, [0, 5, 33], 0, ("ring", "rabenseifner", "tree", "auto"), "split: ")
        n += check_others(sub, [3, 17], "split: ")
        assert comm.split(None) is None  # every rank opts out
    if "hier" in sections:
        for rpn in (2, 3):
            hc = Communicator(check=True, ranks_per_node=rpn)
            n += check_all_reduce(hc, [0, 1, 29, 1000], 0, ("hierarchical", "auto"), f"rpn={rpn}: ")
            if args.big:  # ranks on two (pretend) nodes: the ring's copies go in segments
                n += check_all_reduce(hc, [], args.big, ("ring", "hierarchical"), f"rpn={rpn}: ")
    if comm.rank == 0:
        print(f"OK {n} cases on {p} ranks")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
