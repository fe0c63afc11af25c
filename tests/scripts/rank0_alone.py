"""host.on_rank0_alone on 2+ ranks: rank 0 computes, and every rank gets its result.
Prints one line per rank: its rank and the result (who computed it, and its count)."""
from mpi4py import MPI

from minipar.perf import host

comm = MPI.COMM_WORLD


def work():
    return {"from": comm.rank, "n": sum(range(100_000))}


comm.Barrier()
got = host.on_rank0_alone(comm, work)
print(f"rank {comm.rank} got {got['from']} {got['n']}", flush=True)
