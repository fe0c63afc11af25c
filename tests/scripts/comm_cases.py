"""Run a batch of generated all-reduce / reduce-scatter / all-gather cases in one launch.

argv[1]: JSON list of [n, dtype, op, algorithm] (from the hypothesis test).
"""
import json
import sys

import numpy as np

from comm_correctness import data, expect, ref_reduce
from minipar.comm import (Communicator, abort_on_exception, all_gather, all_reduce, chunk_bounds,
                          reduce_scatter)

abort_on_exception()
comm = Communicator(check=True)
p, r = comm.size, comm.rank
cases = json.loads(sys.argv[1])
for i, (n, dtype, op, alg) in enumerate(cases):
    dt = np.dtype(dtype).type
    want = ref_reduce(p, n, dt, op, seed=i)
    x = data(r, n, dt, seed=i)
    all_reduce(comm, x, op=op, algorithm=alg)
    expect(x, want, f"case {i}: all_reduce {alg} n={n} {dtype} {op}")
    b = chunk_bounds(n, p)
    shard = reduce_scatter(comm, data(r, n, dt, seed=i), op=op)
    expect(shard, want[b[r]:b[r + 1]], f"case {i}: reduce_scatter n={n}")
    expect(all_gather(comm, shard), want, f"case {i}: all_gather n={n}")
if r == 0:
    print(f"OK {len(cases)} generated cases on {p} ranks")
