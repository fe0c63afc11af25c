"""host.on_rank0_alone on 2+ ranks: rank 0 computes while the others sleep, and every rank
gets rank 0's result.  Prints one line per rank: its rank, the result and the CPU share of
its wait (CPU seconds per wall second)."""
import time

from mpi4py import MPI

from minipar.perf import host

comm = MPI.COMM_WORLD


def busy():
    t_end = time.perf_counter() + 0.4
    n = 0
    while time.perf_counter() < t_end:
        n += 1
    return {"from": comm.rank, "n": n}


comm.Barrier()
t0, c0 = time.perf_counter(), time.process_time()
got = host.on_rank0_alone(comm, busy)
share = (time.process_time() - c0) / (time.perf_counter() - t0)
print(f"rank {comm.rank} got {got['from']} {got['n']} share {share:.2f}", flush=True)
