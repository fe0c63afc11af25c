"""Run a batch of generated collective cases in one launch (from the hypothesis test).

argv[1]: a JSON file with a list of cases, each a dict:

    k       ranks taking part: a sub-communicator of ranks 0..k-1 (1..launch size)
    coll    all_reduce | reduce_scatter | all_gather | broadcast | reduce
    shape   the input's shape (0-d to 3-D); step: take every step-th element of a wider
            array along the last axis (step > 1: a strided input)
    out     none | contig | strided (all_gather/reduce_scatter outputs: 1-D, any)
    dtype, op, root (taken mod k), alg (an index into the collective's algorithms),
    async (the non-blocking variant), sizes (all_gather: pass sizes, or let it exchange)

Every rank computes every rank's input (seeded by case and rank), so each checks its
result against NumPy alone.  A mismatch raises with the case in full (the job aborts).
"""
import json
import sys

import numpy as np

from minipar.comm import (Communicator, abort_on_exception, all_gather, all_gather_async,
                          all_reduce, all_reduce_async, broadcast, broadcast_async,
                          chunk_bounds, reduce, reduce_async, reduce_scatter,
                          reduce_scatter_async)

ALGS = {"all_reduce": ["auto", "ring", "recursive_doubling", "rabenseifner", "tree",
                       "hierarchical", "hierarchical:ring", "hierarchical:recursive_doubling"],
        "broadcast": ["auto", "binomial", "scatter_allgather"],
        "reduce": ["auto", "binomial", "ring"]}
REF = {"sum": np.sum, "max": np.max, "min": np.min}


def data(rank, shape, dtype, seed):
    rng = np.random.default_rng([seed, rank])
    dt = np.dtype(dtype)
    lo = 0 if dt.kind in "ub" else -8
    hi = 2 if dt.kind == "b" else 9
    return rng.integers(lo, hi, size=shape).astype(dt)


def strided(shape, dtype, step):
    """An array of ``shape``; with step > 1 a view of every step-th element of a wider one."""
    if step == 1 or not shape:
        return np.zeros(shape, dtype)
    wide = np.zeros(tuple(shape[:-1]) + (shape[-1] * step,), dtype)
    return wide[..., ::step]


def output(kind, shape, dtype):
    if kind == "none":
        return None
    return strided(shape, dtype, 1 if kind == "contig" else 2)


def expect(got, want, case):
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
        raise AssertionError(f"case {case}: got {got.ravel()[:6]} {got.dtype}{got.shape}, "
                             f"want {want.ravel()[:6]} {want.dtype}{want.shape}")


def run(comm, case, i):
    p, r = comm.size, comm.rank
    coll, shape, dtype = case["coll"], tuple(case["shape"]), case["dtype"]
    op = case["op"] if not (dtype == "bool" and case["op"] == "sum") else "max"
    root = case["root"] % p
    inputs = [data(q, shape, dtype, i) for q in range(p)]
    x = strided(shape, dtype, case["step"])
    x[...] = inputs[r]
    n = x.size
    b = chunk_bounds(n, p)
    nb = case["async"]
    reduced = REF[op](np.stack(inputs), axis=0).astype(dtype) if coll != "broadcast" else None
    if coll == "all_reduce":
        alg = ALGS[coll][case["alg"] % len(ALGS[coll])]
        out = output(case["out"], shape, dtype)
        fn = all_reduce_async if nb else all_reduce
        res = fn(comm, x, op=op, algorithm=alg, out=out)
        expect(res.wait(timeout=60) if nb else res, reduced, case)
    elif coll == "reduce_scatter":
        out = output(case["out"], (b[r + 1] - b[r],), dtype)
        res = (reduce_scatter_async if nb else reduce_scatter)(comm, x, op=op, out=out)
        expect(res.wait(timeout=60) if nb else res, reduced.reshape(-1)[b[r]:b[r + 1]], case)
    elif coll == "all_gather":
        full = np.concatenate([inputs[q].reshape(-1)[b[q]:b[q + 1]] for q in range(p)])
        shard = x.reshape(-1)[b[r]:b[r + 1]] if case["step"] == 1 else \
            strided((b[r + 1] - b[r],), dtype, 2)
        shard[...] = full[b[r]:b[r + 1]]
        sizes = list(np.diff(b)) if case["sizes"] else None
        out = output(case["out"], (n,), dtype)
        res = (all_gather_async if nb else all_gather)(comm, shard, sizes=sizes, out=out)
        expect(res.wait(timeout=60) if nb else res, full, case)
    elif coll == "broadcast":
        alg = ALGS[coll][case["alg"] % len(ALGS[coll])]
        if r != root:
            x[...] = 0
        res = (broadcast_async if nb else broadcast)(comm, x, root=root, algorithm=alg)
        expect(res.wait(timeout=60) if nb else res, inputs[root], case)
    else:
        alg = ALGS[coll][case["alg"] % len(ALGS[coll])]
        out = output(case["out"], shape, dtype)
        res = (reduce_async if nb else reduce)(comm, x, root=root, op=op, out=out, algorithm=alg)
        res = res.wait(timeout=60) if nb else res
        if r == root:
            expect(res, reduced, case)
        else:
            assert res is None, case
            expect(x, inputs[r], case)  # non-roots' input untouched


def main():
    abort_on_exception()
    comm = Communicator(check=True)
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    subs = {k: comm.split(0 if comm.rank < k else None, key=comm.rank)
            for k in range(1, comm.size + 1)}
    np.seterr(over="ignore")
    done = 0
    for i, case in enumerate(cases):
        sub = subs[min(case["k"], comm.size)]
        if sub is not None:  # ranks outside this case's communicator go on to the next
            run(sub, case, i)
            done += 1
    total = comm.mpi.reduce(done, root=0)
    if comm.rank == 0:
        print(f"OK {len(cases)} generated cases ({total} rank-runs) on {comm.size} ranks")


if __name__ == "__main__":
    main()
