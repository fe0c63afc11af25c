"""All-to-all-v: every rank sends every rank a block of rows, each block of any size.

    rank r sends    [ rows for 0 | rows for 1 | ... | rows for p-1 ]     M[r][d] rows for d
    rank r receives [ rows from 0 | rows from 1 | ... | rows from p-1 ]  M[s][r] rows from s

``collectives.all_to_all`` checks the arguments and exchanges the counts first, so every
rank knows the whole matrix M (rows s sends d) and the size of every message before any
row moves: both ends of a message know its size, and skip it when it is empty.  Rows
travel as raw bytes, like everything in minipar; w is a row's bytes.

**Pairwise exchange** (the linear shift).  p-1 rounds; in round k rank r sends its block
for (r+k) mod p and receives the block of (r-k) mod p, in one ``sendrecv``.  Every round
is a permutation: each rank sends one message and receives one, so no rank waits for a
rank that waits for it, for any p.  The block for itself is a local copy.  Rank r sends
Σ_{d≠r} M[r][d]·w bytes in at most p-1 messages; uniform blocks (S bytes per rank):

    T = (p-1)·(α + S/p·β) + S/p·γ          (the local copy priced as γ, see cost_model)

**Two-level** (nodes of q ranks, m nodes; rank (a, j) is local rank j of node a).  The
pairwise exchange sends q² messages between every two nodes, spread over nearly all of
its p-1 rounds, and each pays the slow link's α.  Two levels regroup the rows first:

1. inside each node, a pairwise exchange among its q ranks: (a, j) hands local rank t
   every row it has for local rank t of *any* node (those for column j it keeps).  Now
   (a, t) holds every row of node a bound for a rank of local rank t;
2. across nodes, a pairwise exchange among the m ranks of one local rank (the ``cross``
   group of ``hierarchical.node_layout``): (a, j) sends (b, j) the rows of all of node a
   for (b, j).  The q exchanges of two nodes run at once, one per local rank.

    T = (q-1)·(α_in + m·S/p·β_in) + (m-1)·(α_out + q·S/m·β_out) + 2·S·γ

The trade: a row bound for another column crosses its node twice (once inside, once
across), and each rank packs its rows before each phase (2·S of copies).  In return the
slow link is crossed in m-1 rounds instead of p-1: its α is paid per node pair, not per
rank pair, by messages q times larger.  Each byte still crosses the slow link once.  The
cost model (``cost_model.predict_all_to_all``; ``two_level.py`` per link class) prices
both, and ``choose`` takes the cheaper where the group spans nodes.  Nodes of unequal
size, one node, or one rank per node: the two levels are one, and it runs the pairwise
exchange.

Where the group spans nodes, messages over 1 MiB go in 1 MiB segments, two in flight,
as the ring's copies do (``exchange.exchange``: one message per flow stalls flows that
share a wire).  Both ends cut a message alike, from its size, which both know.
"""
from __future__ import annotations

import numpy  # host metadata (counts, node tables) only

from minipar.backend import xp
from minipar.comm import cost_model
from minipar.comm.agree import gather_rows
from minipar.comm.chunks import segments
from minipar.comm.exchange import SEGMENT_BYTES
from minipar.comm.hierarchical import node_layout
from minipar.comm.nodes import spans_nodes
from minipar.comm.transport import COLL_TAG


# ------------------------------------------------------------------ one message each way
def _pieces(block, segmented):
    """How many messages ``block`` goes as: none if it is empty, 1 MiB segments (at most
    one per row) across nodes, else one."""
    if block.nbytes == 0:
        return 0
    if not segmented:
        return 1
    return min(segments(block.nbytes, SEGMENT_BYTES), block.shape[0])


def _swap(comm, send, dest, recv, src, segmented):
    """Send ``send`` to ``dest`` while receiving ``recv`` from ``src``; an empty side is
    skipped (its partner knows it is empty too)."""
    ns, nr = _pieces(send, segmented), _pieces(recv, segmented)
    if ns == nr == 1:
        comm.sendrecv(send, dest, recv, src, COLL_TAG)
        return

    def piece(block, n, k):
        rows = block.shape[0]
        return block[rows * k // n: rows * (k + 1) // n]

    def post(k):
        reqs = [comm.irecv(piece(recv, nr, k), src, COLL_TAG)] if k < nr else []
        return reqs + ([comm.isend(piece(send, ns, k), dest, COLL_TAG)] if k < ns else [])
    n = max(ns, nr)
    flight = [post(k) for k in range(min(2, n))]
    for k in range(n):
        comm.waitall(flight[k])
        if k + 2 < n:
            flight.append(post(k + 2))


def linear_shift(comm, outgoing, incoming, segmented):
    """The pairwise exchange's rounds over ``comm``: ``incoming[s]`` <- rank s's
    ``outgoing[me]``.  ``outgoing[me]`` is copied into ``incoming[me]`` (None: already
    there).  Blocks are row blocks (C-contiguous), sized as their partners expect."""
    p, r = comm.size, comm.rank
    if outgoing[r] is not None:
        incoming[r][...] = outgoing[r]
    for k in range(1, p):
        dest, src = (r + k) % p, (r - k) % p
        _swap(comm, outgoing[dest], dest, incoming[src], src, segmented)


def _offsets(counts):
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def _blocks(buf, counts):
    off = _offsets(counts)
    return [buf[off[i]:off[i + 1]] for i in range(len(counts))]


# ------------------------------------------------------------------ the two algorithms
def pairwise_all_to_all(comm, send, matrix, out):
    """``send`` (rows by destination) -> ``out`` (rows by source), 2-D row arrays;
    ``matrix[s][d]``: the rows s sends d (lists of ints)."""
    r = comm.rank
    linear_shift(comm, _blocks(send, matrix[r]), _blocks(out, [row[r] for row in matrix]),
                 comm.size > 1 and spans_nodes(comm))


def node_table(comm):
    """(local, cross, nodes) for ``comm``, built collectively once and cached: the node
    communicators of ``hierarchical.node_layout`` and ``nodes[a][j]``, the rank of local
    rank j on node a.  ``nodes`` is None where nodes differ in size."""
    key = ("all_to_all nodes", comm.ranks_per_node)
    if key not in comm.cache:
        local, cross, uniform, _ = node_layout(comm)
        nodes = None
        if uniform:     # cross is split with key = node: its rank is my node's index
            where = gather_rows(comm, numpy.array([cross.rank, local.rank], dtype=numpy.int64))
            nodes = [[0] * local.size for _ in range(cross.size)]
            for rank, (a, j) in enumerate(where.tolist()):
                nodes[a][j] = rank
        comm.cache[key] = (local, cross, nodes)
    return comm.cache[key]


def _two_levels(nodes):
    return nodes is not None and len(nodes) > 1 and len(nodes[0]) > 1


def two_level_all_to_all(comm, send, matrix, out):
    """Inside each node by destination column, then across nodes by column (module doc)."""
    local, cross, nodes = node_table(comm)
    if not _two_levels(nodes):
        return pairwise_all_to_all(comm, send, matrix, out)
    m, q = len(nodes), len(nodes[0])
    me, a, j = comm.rank, cross.rank, local.rank
    width, segmented = send.shape[1], spans_nodes(comm)
    mine = _blocks(send, matrix[me])                     # by destination rank

    # 1. inside the node: pack my rows by the column t they are bound for (node b inside),
    # and swap column t with local rank t.  held[s]: what local rank s hands me, by node.
    held_sizes = [[matrix[nodes[a][s]][nodes[b][j]] for b in range(m)] for s in range(q)]
    held = _blocks(xp.empty((sum(map(sum, held_sizes)), width), dtype=send.dtype),
                   [sum(n) for n in held_sizes])
    outgoing = []
    for t in range(q):
        into = held[j] if t == j else xp.empty(
            (sum(matrix[me][nodes[b][t]] for b in range(m)), width), dtype=send.dtype)
        for block, part in zip(_blocks(into, [matrix[me][nodes[b][t]] for b in range(m)]),
                               (mine[nodes[b][t]] for b in range(m))):
            block[...] = part
        outgoing.append(None if t == j else into)
    linear_shift(local, outgoing, held, segmented)

    # 2. across nodes: for node b, the rows of every local rank s of my node bound for
    # (b, j), in the order of s; what arrives from node c is rows from (c, 0), (c, 1), ...
    arriving = [sum(matrix[nodes[c][s]][me] for s in range(q)) for c in range(m)]
    in_order = [nodes[c][s] for c in range(m) for s in range(q)] == list(range(comm.size))
    inbox = out if in_order else xp.empty((sum(arriving), width), dtype=send.dtype)
    incoming = _blocks(inbox, arriving)
    by_node = [_blocks(held[s], held_sizes[s]) for s in range(q)]
    outgoing = []
    for b in range(m):
        into = incoming[a] if b == a else xp.empty(
            (sum(held_sizes[s][b] for s in range(q)), width), dtype=send.dtype)
        for s, block in enumerate(_blocks(into, [held_sizes[s][b] for s in range(q)])):
            block[...] = by_node[s][b]
        outgoing.append(None if b == a else into)
    linear_shift(cross, outgoing, incoming, segmented)
    if not in_order:        # nodes that are not runs of consecutive ranks: rows by source
        by_source = _blocks(out, [row[me] for row in matrix])
        for c in range(m):
            for s, block in enumerate(_blocks(incoming[c], [matrix[nodes[c][s]][me]
                                                            for s in range(q)])):
                by_source[nodes[c][s]][...] = block
    return out


ALL_TO_ALL = {"pairwise": pairwise_all_to_all, "two_level": two_level_all_to_all}


def choose(comm, matrix, row_bytes, c):
    """The algorithm ``auto`` runs: pairwise where the group is on one node (or its nodes
    differ in size), else the cheaper by the cost model, priced for the busiest sender's
    bytes spread evenly (every rank knows the matrix, so every rank picks the same)."""
    if comm.size == 1 or not spans_nodes(comm):
        return "pairwise"
    _, _, nodes = node_table(comm)
    if not _two_levels(nodes):
        return "pairwise"
    nbytes = max(map(sum, matrix)) * row_bytes
    key = ("auto", "all_to_all", nbytes)      # cost_model.use forgets it with the constants
    if key not in comm.cache:
        q = len(nodes[0])
        comm.cache[key] = min(cost_model.ALL_TO_ALL_ALGORITHMS, key=lambda name: (
            cost_model.predict_all_to_all(name, comm.size, nbytes, c, q)))
    return comm.cache[key]
