"""Failure modes that must end the job quickly, never hang (run under mpiexec).

    comm_fail.py size|dtype|op   check mode: rank 1 disagrees -> CollectiveMismatchError on all
    comm_fail.py abort           rank 2 raises; the others wait in an all-reduce -> Abort
"""
import sys

import numpy as np

from minipar.comm import Communicator, abort_on_exception, all_reduce

mode = sys.argv[1]
comm = Communicator(check=True)
odd = comm.rank == 1
if mode == "size":
    all_reduce(comm, np.ones(100 + odd, np.float32))
elif mode == "dtype":
    all_reduce(comm, np.ones(100, np.float64 if odd else np.float32))
elif mode == "op":
    all_reduce(comm, np.ones(100, np.float32), op="max" if odd else "sum")
elif mode == "abort":
    abort_on_exception()
    if comm.rank == 2:
        raise ValueError("boom on purpose")
    all_reduce(comm, np.ones(10, np.float32))  # would wait forever for rank 2
    all_reduce(comm, np.ones(10, np.float32))
print("unreachable: no error raised")
