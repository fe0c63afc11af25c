"""All-reduce algorithms vs MPI's own Allreduce, side by side (the same as
``mpiexec -n N python -m minipar bench comm``).

    OMP_NUM_THREADS=1 mpiexec -n 2 python benchmarks/comm_allreduce.py [--max-size 64M] [--json FILE]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipar.comm.bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
