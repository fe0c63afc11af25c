"""Print, as one JSON line per rank, the thread budget minipar chose and what the
BLAS itself reports (threadpoolctl), for tests/test_threads.py.

    [mpiexec -n N] python tests/scripts/threads_report.py [--numpy-first] [--hide-launcher] [--split]

--numpy-first     import NumPy before setup_process: the budget must reach a running pool
--hide-launcher   forget the launcher's variables, as an unknown launcher would
--split           then ask MPI how many ranks share this machine
"""
import json
import os
import sys

if "--hide-launcher" in sys.argv:
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        os.environ.pop(name, None)
if "--numpy-first" in sys.argv:
    import numpy  # noqa: F401

import threadpoolctl  # noqa: E402

import minipar  # noqa: E402
from minipar.process import threads  # noqa: E402

budget = minipar.setup_process()    # before NumPy is imported, unless --numpy-first

import numpy as np  # noqa: E402

rank = 0
if "--split" in sys.argv:
    from mpi4py import MPI
    budget = threads.budget_threads(MPI.COMM_WORLD)
    rank = MPI.COMM_WORLD.Get_rank()
np.ones((64, 64)) @ np.ones((64, 64))          # the pool is live
blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
report = {"rank": int(os.environ.get("PMI_RANK", rank)), "ranks_on_node": budget.ranks_on_node,
          "cores": budget.cores, "threads": budget.threads, "source": budget.source,
          "user_setting": budget.user_setting, "blas": blas,
          "describe": threads.describe_threads(budget)}
with open(os.path.join(os.environ["THREADS_REPORT_DIR"], f"rank{report['rank']}.json"), "w") as f:
    json.dump(report, f)
