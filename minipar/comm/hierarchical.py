"""Two-level (hierarchical) all-reduce: fast links inside a node, slow ones between nodes.

With m nodes of q ranks each (p = m·q) and a buffer of S bytes:

1. intra-node ring reduce-scatter: local rank j holds shard j (S/q bytes) of its node's sum;
2. inter-node all-reduce of the shards: the q ranks with local rank j (one per node)
   all-reduce shard j — q such all-reduces run at once, one per local rank;
3. intra-node ring all-gather of the reduced shards.

Only S/q bytes per rank cross the slow network, 2(m-1)/m·S/q of them with a ring, so
the inter-node volume per *node* is 2(m-1)/m·S — as if each node were one rank:

    T = 2(q-1)·α_in + 2(q-1)/q·S·β_in  +  T_allreduce(m, S/q; α_out, β_out)  + reductions

Nodes come from MPI's shared-memory split (``MPI.COMM_TYPE_SHARED``), or, so one machine
can teach it, from ``ranks_per_node`` (node = rank // ranks_per_node).  If the nodes
are not all the same size the shards would not line up across nodes, so the fallback is
reduce to each node's leader, all-reduce among leaders, broadcast inside the node.

The node layout is built collectively on first use and cached, with buffer-based p2p
only (no pickled mpi4py collective: those hold the GIL while they wait, and a progress
thread building the same kind of layout at the same time would then deadlock the
process).  Non-blocking collectives build their layout on the main thread at submission
(``nonblocking.py``), never on the progress thread.
"""
from __future__ import annotations

import numpy  # host metadata (node numbers) only
from mpi4py import MPI

from minipar.comm.agree import gather_rows
from minipar.comm.chunks import chunk_bounds
from minipar.comm.nodes import remember
from minipar.comm.ring import ring_all_gather, ring_reduce_scatter
from minipar.comm.tree import binomial_broadcast, binomial_reduce


def node_layout(comm):
    """(local, cross, uniform, n_nodes) for ``comm``, built once and cached.

    ``local``: the ranks of my node; ``cross``: the ranks with my local rank on every
    node (uniform nodes), or the node leaders (None on non-leaders) otherwise.
    """
    key = ("nodes", comm.ranks_per_node)
    if key in comm.cache:
        return comm.cache[key]
    if comm.ranks_per_node:
        node = comm.rank // comm.ranks_per_node
    else:
        shared = comm._like(comm._setup(comm.mpi.Split_type, MPI.COMM_TYPE_SHARED, comm.rank), True)
        mine = numpy.array([comm.rank], dtype=numpy.int64)
        node = int(gather_rows(shared, mine).min())  # the lowest rank names the node
        shared.mpi.Free()
    local = comm.split(node, comm.rank, share_counters=True)
    info = gather_rows(comm, numpy.array([node, local.size], dtype=numpy.int64)).tolist()
    uniform = len({q for _, q in info}) == 1
    if uniform:
        cross = comm.split(local.rank, node, share_counters=True)
    else:
        cross = comm.split(0 if local.rank == 0 else None, node, share_counters=True)
    comm.cache[key] = (local, cross, uniform, len({n for n, _ in info}))
    remember(comm, len({n for n, _ in info}) > 1)
    remember(local, False)
    if cross is not None:
        remember(cross, cross.size > 1)
    return comm.cache[key]


def hierarchical_all_reduce(comm, buf, reduce, inner):
    """All-reduce in place in two levels; ``inner(comm, shard)`` all-reduces across nodes."""
    if comm.size == 1:
        return buf
    local, cross, uniform, _ = node_layout(comm)
    if uniform:
        b = chunk_bounds(buf.size, local.size)
        ring_reduce_scatter(local, buf, reduce, b)
        j = local.rank
        if cross.size > 1:
            inner(cross, buf[b[j]:b[j + 1]])
        ring_all_gather(local, buf, b)
    else:
        binomial_reduce(local, buf, reduce, 0)
        if cross is not None and cross.size > 1:
            inner(cross, buf)
        binomial_broadcast(local, buf, 0)
    return buf
