"""Run on a 2-node simulated cluster (tests/test_cluster.py): MPI sees two nodes of two
ranks (Split_type(COMM_TYPE_SHARED) follows the namespaces), and minipar's ring and
hierarchical all-reduces of 1 MiB across them give NumPy's sum.  Each rank's thread
budget counts all four ranks (they share this machine's cores, whatever namespace they
run in), and the ranks were handed the cluster's profile, which knows the shaped link."""
import json
import os

import numpy as np
from mpi4py import MPI

from minipar.comm import Communicator, abort_on_exception, all_reduce
from minipar.perf.profile import load_profile
from minipar.process.threads import budget_threads

abort_on_exception()
world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED)
members = sorted(world.allgather((node.Get_size(), tuple(node.allgather(world.rank)))))
comm = Communicator(check=True)
rng = np.random.default_rng(comm.rank)
data = rng.standard_normal(1 << 17)                      # 1 MiB of float64
everyone = np.array(world.allgather(data))
results = {}
for algorithm in ("ring", "hierarchical"):
    got = all_reduce(comm, data.copy(), algorithm=algorithm)
    error = float(np.abs(got - everyone.sum(0)).max() / np.abs(everyone).sum(0).max())
    results[algorithm] = error
budget = budget_threads(world)
profile = load_profile()          # $MINIPAR_PROFILE, as a run reads it
if comm.rank == 0:
    print("RESULT " + json.dumps({"nodes": sorted(set(m[1] for m in members)), "errors": results,
                                  "ranks_sharing_cores": budget.ranks_on_node,
                                  "profile": os.environ.get("MINIPAR_PROFILE"),
                                  "inter_bw": profile.links.get("inter", {}).get("bw"),
                                  "nodes_per_host": profile.nodes_per_host}))
