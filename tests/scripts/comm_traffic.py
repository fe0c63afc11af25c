"""Traffic counters against the textbook volumes (run under mpiexec; raises on mismatch).

S = n·itemsize bytes, p ranks, chunk c has size_c elements (array_split rule):
- ring all-reduce: rank r sends 2n - size_r - size_(r+1) elements = 2(p-1)/p·S up to
  uneven chunks, in 2(p-1) messages, and receives 2n - size_(r-1) - size_r;
- ring reduce-scatter: n - size_r; ring all-gather: n - size_(r+1);
- recursive doubling (p a power of two): log2(p)·S in log2(p) messages;
- Rabenseifner (p a power of two): 2(p-1)/p·S up to uneven blocks;
- tree all-reduce: 2(p-1)·S over all ranks together; binomial broadcast: (p-1)·S;
- hierarchical, nodes of q ranks: 2(q-1)/q·S inside + 2(m-1)/m·S/q across per rank;
- every algorithm, every rank: the bytes of its steps in comm/two_level.py.
"""
import math

import numpy as np
from mpi4py import MPI

from minipar.comm import (Communicator, abort_on_exception, all_gather, all_reduce, broadcast,
                          chunk_sizes, reduce_scatter, two_level)


def measure(comm, fn):
    comm.reset_counters()
    fn()
    return comm.bytes_sent, comm.bytes_recv, comm.msgs_sent, comm.msgs_recv


def total(value):
    return MPI.COMM_WORLD.allreduce(value)


def main():
    abort_on_exception()
    comm = Communicator(check=True)
    p, r = comm.size, comm.rank
    for n in (0, 1, p + 1, 1000, 1003, 4097):
        x = np.ones(n, dtype=np.float64)
        it = x.itemsize
        S = n * it
        sz = chunk_sizes(n, p)
        sent, recv, ms, mr = measure(comm, lambda: all_reduce(comm, x, algorithm="ring"))
        if p > 1:
            assert sent == it * (2 * n - sz[r] - sz[(r + 1) % p]), (n, sent)
            assert recv == it * (2 * n - sz[(r - 1) % p] - sz[r]), (n, recv)
            assert abs(sent - 2 * (p - 1) / p * S) <= 2 * it, (n, sent)
            assert ms == mr == (2 * (p - 1) if n else 0), (ms, mr)
        else:
            assert sent == recv == 0
        sent, *_ = measure(comm, lambda: reduce_scatter(comm, x))
        assert sent == it * (n - sz[r]) if p > 1 else sent == 0, (n, sent)
        b = np.cumsum([0] + sz)
        sent, *_ = measure(comm, lambda: all_gather(comm, x[b[r]:b[r + 1]], sizes=sz))
        assert sent == it * (n - sz[(r + 1) % p]) if p > 1 else sent == 0, (n, sent)
        if p & (p - 1) == 0 and p > 1:
            L = int(math.log2(p))
            sent, _, ms, _ = measure(comm, lambda: all_reduce(comm, x, algorithm="recursive_doubling"))
            assert sent == L * S and ms == (L if n else 0), (sent, ms)
            sent, *_ = measure(comm, lambda: all_reduce(comm, x, algorithm="rabenseifner"))
            assert abs(sent - 2 * (p - 1) / p * S) <= 2 * L * it, (n, sent)
        sent, *_ = measure(comm, lambda: all_reduce(comm, x, algorithm="tree"))
        assert total(sent) == 2 * (p - 1) * S, (n, total(sent))
        sent, *_ = measure(comm, lambda: broadcast(comm, x, algorithm="binomial"))
        assert total(sent) == (p - 1) * S, (n, total(sent))
        # the two-level cost model writes each algorithm as steps of messages: its bytes
        # per rank are what the code sends (up to uneven chunks: an element per message)
        for algorithm in ("ring", "recursive_doubling", "rabenseifner", "tree"):
            sent, _, ms, _ = measure(comm, lambda: all_reduce(comm, x, algorithm=algorithm))
            want = two_level.bytes_sent(algorithm, p, S)[r]
            assert abs(sent - want) <= max(ms, 1) * it, (algorithm, n, sent, want)
    if p % 2 == 0 and p >= 4:  # hierarchical, nodes of 2: S/2 inside twice, S/2·2(m-1)/m across
        hc = Communicator(check=True, ranks_per_node=2)
        m, n = p // 2, 4 * p * 16
        x = np.ones(n, dtype=np.float64)
        S = n * x.itemsize
        sent, *_ = measure(hc, lambda: all_reduce(hc, x, algorithm="hierarchical:ring"))
        want = S / 2 + S / 2 + (2 * (m - 1) / m * S / 2 if m > 1 else 0)
        assert abs(sent - want) <= 4 * x.itemsize, (sent, want)
        assert sent == two_level.bytes_sent("hierarchical", p, S, q=2)[r], (sent, want)
        assert np.all(x == p)
    if r == 0:
        print(f"traffic OK on {p} ranks")


if __name__ == "__main__":
    main()
