"""Every misuse of a collective answered by a clear error on every rank (under mpiexec).

Each case of the table runs on every rank; a case raises on every rank, in check mode,
before any data moves, so the next case starts from a clean state.  Cases marked
``everywhere`` are wrong on every rank alike, so they also run with check mode off (each
rank's own argument checks must refuse them before a message).  Rank 0 prints one JSON
line: {case: {"check": [[error type, message] per rank], "nocheck": ...}}; the pytest
side (test_comm_misuse.py) asserts on it.
"""
import json
import sys

import numpy as np

from minipar.comm import (Communicator, all_gather, all_reduce, all_reduce_async, barrier,
                          broadcast, reduce, reduce_scatter, reduce_scatter_async)


def ones(n, dtype=np.float32):
    return np.ones(n, dtype=dtype)


# name -> (fn(comm), answered on every rank even with check mode off?)
def cases(p, r):
    odd = r == 1
    ro = ones(4)
    ro.flags.writeable = False
    return {
        "all_reduce out shape, one rank": (
            lambda c: all_reduce(c, ones(4), out=ones(5 if odd else 4)), False),
        "all_reduce out dtype": (lambda c: all_reduce(c, ones(4), out=ones(4, np.float64)), True),
        "all_reduce read-only": (lambda c: all_reduce(c, ro), True),
        "all_reduce str": (lambda c: all_reduce(c, np.array(["ab", "c"])), True),
        "all_reduce object": (lambda c: all_reduce(c, np.array([1, "x"], dtype=object)), True),
        "all_reduce bool sum": (lambda c: all_reduce(c, np.ones(3, bool)), True),
        "all_reduce list": (lambda c: all_reduce(c, [1.0, 2.0] if odd else ones(2)), False),
        "all_reduce unknown op, one rank": (
            lambda c: all_reduce(c, ones(3), op="prod" if odd else "sum"), False),
        "all_reduce unknown algorithm": (
            lambda c: all_reduce(c, ones(3), algorithm="butterfly"), True),
        "all_reduce algorithm mismatch": (
            lambda c: all_reduce(c, ones(3), algorithm="tree" if odd else "ring"), False),
        "all_reduce count mismatch": (lambda c: all_reduce(c, ones(6 + odd)), False),
        "all_reduce dtype mismatch": (
            lambda c: all_reduce(c, ones(6, np.float64 if odd else np.float32)), False),
        "async all_reduce out shape, one rank": (
            lambda c: all_reduce_async(c, ones(4), out=ones(3 if odd else 4)).wait(timeout=60),
            False),
        "reduce out on root only": (
            lambda c: reduce(c, ones(4), root=1, out=ones(2) if odd else None), False),
        "reduce root = size": (lambda c: reduce(c, ones(4), root=p), True),
        "reduce root = -1": (lambda c: reduce(c, ones(4), root=-1), True),
        "reduce root not an int": (lambda c: reduce(c, ones(4), root=0.5), True),
        "reduce root mismatch": (lambda c: reduce(c, ones(4), root=1 if odd else 0), False),
        "broadcast root = size": (lambda c: broadcast(c, ones(4), root=p), True),
        "broadcast root = -1": (lambda c: broadcast(c, ones(4), root=-1), True),
        "broadcast object": (lambda c: broadcast(c, np.array([None, 1], dtype=object)), True),
        "broadcast unknown algorithm": (lambda c: broadcast(c, ones(4), algorithm="ring"), True),
        "reduce_scatter small shard into big out": (
            lambda c: reduce_scatter(c, ones(p), out=ones(7)), True),
        "reduce_scatter out dtype (int16 from float)": (
            lambda c: reduce_scatter(c, ones(2 * p) * 4.5, out=np.zeros(2, np.int16)), True),
        "async reduce_scatter out size, one rank": (
            lambda c: reduce_scatter_async(c, ones(2 * p), out=ones(3 if odd else 2)).wait(timeout=60),
            False),
        "all_gather out too big (sizes given)": (
            lambda c: all_gather(c, ones(2), sizes=[2] * p, out=ones(2 * p + 3)), True),
        "all_gather out too big, one rank (sizes exchanged)": (
            lambda c: all_gather(c, ones(2), out=ones(2 * p + odd)), True),  # the size exchange checks it
        "all_gather out too big, every rank (sizes exchanged)": (
            lambda c: all_gather(c, ones(2), out=ones(2 * p + 1)), True),
        "all_gather out dtype": (
            lambda c: all_gather(c, ones(2), out=np.zeros(2 * p, np.float64)), True),
        "all_gather dtype mismatch": (
            lambda c: all_gather(c, ones(2, np.float64 if odd else np.float32)), False),
        "all_gather sizes on one rank only": (
            lambda c: all_gather(c, ones(2), sizes=[2] * p if odd else None), False),
        "all_gather sizes wrong length": (
            lambda c: all_gather(c, ones(2), sizes=[2] * (p + 1)), True),
        "all_gather shard is not sizes[rank]": (
            lambda c: all_gather(c, ones(3 if odd else 2), sizes=[2] * p), False),
        "barrier vs all_reduce": (lambda c: barrier(c) if odd else all_reduce(c, ones(2)), False),
    }


def outcome(fn, comm):
    try:
        fn(comm)
    except Exception as err:  # recorded, not raised: the table is the test
        return [type(err).__name__, str(err)]
    return ["no error", ""]


def main():
    check, nocheck = Communicator(check=True), Communicator(check=False)
    p, r = check.size, check.rank
    assert p >= 2, "run on 2+ ranks"
    results = {}
    for name, (fn, everywhere) in cases(p, r).items():
        res = {"check": outcome(fn, check)}
        if everywhere:
            res["nocheck"] = outcome(fn, nocheck)
        all_reduce(check, ones(3))  # the communicator still works after the error
        res = check.mpi.gather(res, root=0)
        if r == 0:
            results[name] = {k: [rank_res[k] for rank_res in res] for k in res[0]}
    if r == 0:
        print(json.dumps(results))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
