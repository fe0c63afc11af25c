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
}
