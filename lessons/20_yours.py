"""Lesson 20's exercise on every rank: your hierarchical all-reduce over real messages.

    mpiexec -n 4 python lessons/20_yours.py --file MINE.py               # the check
    mpiexec -n 4 python lessons/20_yours.py --file MINE.py --time 16M    # a timing

``MINE.py`` defines ``my_hierarchical_all_reduce(comm, x, q)``: sum the 1-D float64 array
``x`` over every rank of ``comm``, in place, where nodes hold q consecutive ranks
(node(r) = r // q).  With m = p / q nodes and S = x.nbytes:

1. reduce-scatter inside each node: local rank j ends with shard j of its node's sum;
2. the m ranks with local index j (one per node) all-reduce shard j across the nodes;
3. all-gather inside each node.

Every rank sends only its shard across, S/q·2(m-1)/m bytes — the bytes two_level's
``hierarchical_steps`` prices — where the flat ring sends 2(p-1)/p·S from every rank,
and a node's link carries 2(m-1)/m·S against the ring's 2(p-1)/p·S·(ranks that send off
the node).  The check counts what each rank sends to ranks of *other* nodes by wrapping
the Communicator's ``send``, ``isend`` and ``sendrecv`` (every communicator, so a split
one counts too), on arrays of 1000, 0, 1, 3, 7, 1001 and 4099 elements, nodes of 2, 1
and 4 ranks:

- **parity**: the result equals NumPy's sum of every rank's array (relative 1e-12); if
  not, which phase left which shard wrong (still this rank's own input: phase 1; its
  node's sum only: phase 2; another local rank's shard not brought: phase 3);
- **traffic**: the bytes sent off node equal the model's, exactly when the shards split
  evenly, within one element per message when they do not; and a node sends fewer bytes
  across than the flat ring would.

``--time BYTES`` instead times your all-reduce, the library's hierarchical one and the
library's flat ring on one array of that size (the median of 3, after a warm-up) and
rank 0 prints them as one JSON line (your result is first compared with the library's
ring): on the lesson's simulated cluster, the link is real.
"""
import argparse
import json
import os
import statistics
import sys
import time

try:
    import minipar  # noqa: F401
except ImportError:  # run from a checkout without installing: use the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
from mpi4py import MPI

from minipar import backend
from minipar.backend import to_device, to_host
from minipar.comm import Communicator, all_reduce, chunk_bounds, two_level
from yours import check_on_every_rank, load

SIZES = (1000, 0, 1, 3, 7, 1001, 4099)     # elements: even, empty, fewer than ranks, uneven
NODE_SIZES = (2, 1, 4)                     # q: 2 nodes x 2 ranks, then every rank a node, one node
ITEM = 8                                   # float64


def arrays(n, p):
    """Every rank's input for n elements: rank r's is row r (all ranks can build all rows)."""
    return np.random.default_rng(n).standard_normal((p, n))


class OffNodeBytes:
    """Wraps the Communicator's send, isend and sendrecv to count what this rank sends to
    ranks of other nodes, by world rank: on a split communicator the destination is
    translated to its rank in COMM_WORLD."""

    def __init__(self):
        self.q, self.to, self.world_ranks = 1, {}, {}
        self.me = MPI.COMM_WORLD.Get_rank()
        for name in ("send", "isend", "sendrecv"):       # all three take (buf, dest, ...)
            self._wrap(name)

    def _wrap(self, name):
        real, spy = getattr(Communicator, name), self

        def counted(comm, buf, dest, *args, **kwargs):
            world_dest = spy.in_world(comm)[dest]
            if world_dest // spy.q != spy.me // spy.q:
                spy.to[world_dest] = spy.to.get(world_dest, 0) + buf.nbytes
            return real(comm, buf, dest, *args, **kwargs)
        setattr(Communicator, name, counted)

    def in_world(self, comm):
        """COMM_WORLD's rank of each of comm's ranks (computed once per communicator)."""
        if comm not in self.world_ranks:
            group, world = comm.mpi.Get_group(), MPI.COMM_WORLD.Get_group()
            self.world_ranks[comm] = MPI.Group.Translate_ranks(group, list(range(comm.size)), world)
            group.Free()
            world.Free()
        return self.world_ranks[comm]

    def start(self, q):
        self.q, self.to = q, {}

    @property
    def total(self):
        return sum(self.to.values())


def off_node_by_rank(steps, p, q):
    """Bytes each rank sends to other nodes in a step list of two_level."""
    sent = [0.0] * p
    for messages, _ in steps:
        for src, dst, nbytes in messages:
            if src // q != dst // q:
                sent[src] += nbytes
    return sent


def what_went_wrong(got, rows, r, q, n):
    """The first phase whose shard is wrong on this rank, as a phrase; None if right."""
    node, j = divmod(r, q)
    p = rows.shape[0]
    total, node_sum = rows.sum(axis=0), rows[node * q:(node + 1) * q].sum(axis=0)
    b = chunk_bounds(n, q)
    scale = max(1.0, float(np.abs(total).max(initial=0.0)))

    def same(a, want):
        return np.allclose(a, want, rtol=1e-12, atol=1e-12 * scale)
    same_index = [k * q + j for k in range(p // q)]
    order = [j] + [k for k in range(q) if k != j]                 # my own shard first
    for k in order:
        lo, hi = b[k], b[k + 1]
        part = got[lo:hi]
        if same(part, total[lo:hi]):
            continue
        where = f"shard {k} (elements {lo}..{hi})"
        if k != j:
            if same(part, rows[r, lo:hi]):
                held = "still this rank's own input"
            elif same(part, node_sum[lo:hi]):
                held = f"node {node}'s sum only"
            else:
                held = "neither the total nor any partial sum"
            return (f"phase 3 (all-gather inside node {node}), {where}: it is {held}; local rank {k} "
                    f"(rank {node * q + k}) owns that shard after phase 2 and must bring it here")
        if same(part, rows[r, lo:hi]):
            return (f"phase 1 (reduce-scatter inside node {node}), {where}: it is still this rank's own "
                    f"input, not the sum of node {node}'s ranks {list(range(node * q, node * q + q))}")
        if same(part, node_sum[lo:hi]):
            return (f"phase 2 (across nodes), {where}: it is node {node}'s sum only; the ranks with local "
                    f"index {j}, {same_index}, must all-reduce it across the nodes")
        return (f"phase 1 or 2, {where}: it is neither this rank's input, nor node {node}'s sum, nor the "
                f"total (off by {np.abs(part - total[lo:hi]).max():.1e})")
    return None


def check_one(comm, spy, fn, n, q):
    p, r = comm.size, comm.rank
    rows = arrays(n, p)
    x = to_device(rows[r].copy())
    spy.start(q)
    out = fn(comm, x, q)
    got = to_host(x if out is None else out)
    m, S = p // q, n * ITEM
    model = off_node_by_rank(two_level.hierarchical_steps(list(range(p)), float(S), q), p, q)[r]
    sent = (f"sent {spy.total} bytes off node {r // q}" + (f" (to ranks {sorted(spy.to)})" if spy.to else "")
            + f", the hierarchical all-reduce sends S/q·2(m-1)/m = {model:g}")
    head = f"n = {n} float64 (S = {S} bytes), nodes of q = {q} ranks"
    assert got.shape == (n,), f"{head}: the result has shape {got.shape}, not ({n},)"
    wrong = what_went_wrong(got, rows, r, q, n)
    assert wrong is None, f"{head}: {wrong}; {sent}"
    if n % (q * m) == 0:
        assert spy.total == model, f"{head}: the sums are right, but this rank {sent}"
    else:                              # uneven shards: one element more or less per message
        messages = 2 * (m - 1)
        assert abs(spy.total - model) <= ITEM * messages, (
            f"{head}: the sums are right, but this rank {sent} (give or take {messages} elements: "
            f"the shards are uneven)")
    node_sent = sum(comm.mpi.allgather(spy.total)[r // q * q:(r // q + 1) * q])
    ring = off_node_by_rank(two_level.ring_steps(list(range(p)), float(S)), p, q)
    ring_node = sum(ring[r // q * q:(r // q + 1) * q])
    if 1 < q < p and S > 0:
        assert node_sent < ring_node, (f"{head}: node {r // q} sent {node_sent} bytes across, not fewer "
                                       f"than the flat ring's {ring_node:g}")
    return node_sent, ring_node


def check(comm, fn):
    backend.set_default_dtype(np.float64)
    spy = OffNodeBytes()
    for q in NODE_SIZES:
        for n in SIZES:
            node_sent, ring_node = check_one(comm, spy, fn, n, q)
            if comm.rank == 0 and q == 2 and n == SIZES[0]:
                print(f"n = {n} float64, 2 nodes x 2 ranks: node 0 sent {node_sent} bytes across "
                      f"(the flat ring: {ring_node:g}); every rank's sum equals NumPy's", flush=True)
    if comm.rank == 0:
        print(f"correct on {comm.size} ranks for n in {list(SIZES)} and nodes of {list(NODE_SIZES)} ranks; "
              "the bytes off node are the model's", flush=True)


def timed(comm, run, x, repeats=3):
    """Median over repeats of the slowest rank's seconds, after one warm-up."""
    seconds = []
    for i in range(repeats + 1):
        comm.mpi.Barrier()
        t0 = time.perf_counter()
        run(x)
        seconds.append(comm.mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return statistics.median(seconds[1:])


def time_them(comm, fn, nbytes, q):
    n = nbytes // ITEM
    x = to_device(np.random.default_rng(comm.rank).standard_normal(n))
    want = all_reduce(comm, x.copy(), algorithm="ring")
    fn(comm, x, q)
    off = float(np.abs(to_host(x) - to_host(want)).max())
    assert off <= 1e-12 * float(np.abs(to_host(want)).max()), (
        f"n = {n}: your all-reduce's result differs from the library's ring by {off:.1e}")
    nodes = Communicator(ranks_per_node=q, hang_timeout=60)
    yours = timed(comm, lambda a: fn(comm, a, q), x)
    library = timed(nodes, lambda a: all_reduce(nodes, a, algorithm="hierarchical"), x)
    ring = timed(comm, lambda a: all_reduce(comm, a, algorithm="ring"), x)
    if comm.rank == 0:
        print(json.dumps({"bytes": n * ITEM, "q": q, "yours_s": yours, "hierarchical_s": library,
                          "ring_s": ring}), flush=True)


def size_in_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1:].upper() in units else int(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True, help="the learner's my_hierarchical_all_reduce")
    parser.add_argument("--time", type=size_in_bytes, default=None, metavar="BYTES",
                        help="time it (and the library's) on one array of BYTES instead of checking")
    parser.add_argument("--ranks-per-node", type=int, default=2, help="q, for --time")
    parser.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    args = parser.parse_args()
    backend.set_backend(args.backend)
    # check mode off: its agreement messages go through sendrecv too, and would count as traffic
    comm = Communicator(check=False, hang_timeout=20)
    if comm.size % args.ranks_per_node or (args.time is None and comm.size != 4):
        raise SystemExit(2 if comm.rank else f"20_yours.py: run it on 4 ranks (2 nodes x 2) to check, or on a "
                         f"multiple of --ranks-per-node {args.ranks_per_node} to time; got {comm.size}")
    fn = load(args.file, "my_hierarchical_all_reduce")
    if args.time is None:
        check_on_every_rank(comm, check, fn)
    else:
        check_on_every_rank(comm, time_them, fn, args.time, args.ranks_per_node)


if __name__ == "__main__":
    main()
