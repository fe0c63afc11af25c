"""Solutions of lesson 20's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "step_seconds": r'''
def my_step_seconds(messages, q, inside, between):
    """Time of one step: its slowest message, or its busiest node link."""
    slowest, out_of, into = 0.0, {}, {}
    for src, dst, n in messages:
        if src // q == dst // q:
            slowest = max(slowest, inside[0] + n * inside[1])
        else:
            slowest = max(slowest, between[0] + n * between[1])
            out_of[src // q] = out_of.get(src // q, 0.0) + n
            into[dst // q] = into.get(dst // q, 0.0) + n
    for total in list(out_of.values()) + list(into.values()):
        slowest = max(slowest, between[0] + total * between[1])
    return slowest
''',
    "hierarchical": r'''
def my_hierarchical_steps(ranks, S, q):
    """Reduce-scatter in every node, all-reduce of each shard across nodes, all-gather in every node."""
    nodes = [ranks[i:i + q] for i in range(0, len(ranks), q)]
    rings = [two_level.ring_steps(node, S) for node in nodes]
    half = len(rings[0]) // 2
    reduce_scatter = two_level.at_once([ring[:half] for ring in rings])
    across = two_level.at_once([two_level.ring_steps([node[j] for node in nodes], S / q) for j in range(q)])
    all_gather = two_level.at_once([ring[half:] for ring in rings])
    return reduce_scatter + across + all_gather
''',
    "hierarchical_all_reduce": r'''
%%writefile {MINE}/hierarchical.py
"""Your hierarchical all-reduce over real messages (lesson 20): run under mpiexec by 20_yours.py."""
from minipar.backend import xp
from minipar.comm.chunks import chunk_bounds


def ring_reduce_scatter(comm, x, group, bounds):
    """Round the ranks in group (world ranks): afterwards group[i] holds chunk i of their sum."""
    p, i = len(group), group.index(comm.rank)
    right, left = group[(i + 1) % p], group[(i - 1) % p]
    for s in range(p - 1):
        out, arriving = (i - s - 1) % p, (i - s - 2) % p
        landed = xp.empty(bounds[arriving + 1] - bounds[arriving], dtype=x.dtype)
        comm.sendrecv(x[bounds[out]:bounds[out + 1]], right, landed, left)
        x[bounds[arriving]:bounds[arriving + 1]] += landed


def ring_all_gather(comm, x, group, bounds):
    """Round the ranks in group: group[i] brings chunk i, and every rank ends with all of them."""
    p, i = len(group), group.index(comm.rank)
    right, left = group[(i + 1) % p], group[(i - 1) % p]
    for s in range(p - 1):
        out, arriving = (i - s) % p, (i - s - 1) % p
        comm.sendrecv(x[bounds[out]:bounds[out + 1]], right, x[bounds[arriving]:bounds[arriving + 1]], left)


def my_hierarchical_all_reduce(comm, x, q):
    """Reduce-scatter in my node, all-reduce my shard across the nodes, all-gather in my node."""
    node, j = divmod(comm.rank, q)
    my_node = [node * q + k for k in range(q)]                    # ranks of my node
    same_index = [n * q + j for n in range(comm.size // q)]       # local index j on every node
    shards = chunk_bounds(x.size, q)
    ring_reduce_scatter(comm, x, my_node, shards)                 # 1: shard j of my node's sum
    shard = x[shards[j]:shards[j + 1]]                            # a view: phase 2 works in x
    pieces = chunk_bounds(shard.size, len(same_index))
    ring_reduce_scatter(comm, shard, same_index, pieces)          # 2: a ring all-reduce of shard j
    ring_all_gather(comm, shard, same_index, pieces)              #    across the nodes
    ring_all_gather(comm, x, my_node, shards)                     # 3: every shard to every rank
    return x
''',
}
