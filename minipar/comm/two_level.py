"""The α-β model over two kinds of links: a collective as steps of messages, each priced
by the link it crosses.

Nodes hold q consecutive ranks (node(r) = r // q, the launcher's block placement).  A
message of n bytes costs

    inside a node     k·α     + n·β(n)       (the calibrated shared-memory constants)
    between nodes     k·α_out + n·β_out      (the wire: calibrated across it)

with k the pipeline segments it is cut into.  The messages of one step run at once, so
a step costs its slowest message — but every message that leaves a node in that step
shares the node's one link, and so does every message that enters it:

    step = max( max over messages (k·α_link + n·β_link),
                max over nodes    (α_out + Σ bytes out of (into) the node · β_out) )
           + n_reduced·γ

A shaped link (the simulated cluster's token bucket, ``cluster/netns.py``) lets a burst of
B bytes through at once after it has idled (``burst_inter``, calibrated): each node link
keeps a credit c, a step's bytes n through it cost max(n - c, 0)·β_out, and it earns
credit at its rate while it idles, up to B.  A collective starts with a full B on every
link, as one that follows compute finds it (a gradient all-reduce after backward; ``bench
comm`` lets the link idle before each call it times, since otherwise a call's time
depends on how long the call before it left the link idle).  So a ring, busy both ways
every step, saves B once, in its first step, while a tree's reduce and broadcast cross
the link one way each, and each crossing finds a full B: the broadcast's way idled
during the reduce.

Each algorithm is written below as the data of its steps (who sends how many bytes to
whom), following the code in ring.py, doubling.py, tree.py and hierarchical.py — and the
all-to-all's two, following alltoall.py; the one pricing function above turns any of
them into seconds.  What the flat model of
cost_model.py cannot see and this one can: a ring over 2 nodes crosses the wire once per
step per node, while the hierarchical all-reduce sends only S/q per rank across it, all
q of a node's ranks at once — the same bytes through one link.

Like the flat model, this one is arithmetic on the constants (``cost_params.py``) and
``auto`` decides by it across nodes, so it lives in ``comm`` below the collectives; the
constants of the link between nodes are measured in ``perf/calibrate_links.py``
(``calibrate_across``).
"""
from __future__ import annotations

import math
from collections import defaultdict

from minipar.comm.chunks import pow2_floor, segments
from minipar.comm.cost_params import beta_of, gamma_of
from minipar.comm.exchange import SEGMENT_BYTES


# ------------------------------------------------------------------ the steps of each algorithm
# A step is (messages, reduced_bytes): messages [(src, dst, nbytes)], reduced_bytes the most
# any one rank reduces in that step.

def ring_steps(ranks, S):
    """Reduce-scatter then all-gather around ``ranks``: 2(p-1) steps of S/p to the right."""
    p = len(ranks)
    if p < 2:
        return []
    piece = S / p
    shift = [(ranks[i], ranks[(i + 1) % p], piece) for i in range(p)]
    return [(shift, piece)] * (p - 1) + [(shift, 0.0)] * (p - 1)


def _fold_steps(ranks, S):
    """Non-powers of two: the first 2·rem ranks pair up, the even one hands its buffer
    over before (and takes the result back after), as ``doubling._fold_in`` and
    ``_fold_out`` do.  Returns (steps in, steps out, survivors); the flat model's
    closed form of their cost is ``cost_model._fold_seconds``."""
    p = len(ranks)
    rem = p - pow2_floor(p)
    if not rem:
        return [], [], list(ranks)
    pairs = [(ranks[2 * i], ranks[2 * i + 1]) for i in range(rem)]
    survivors = [odd for _, odd in pairs] + list(ranks[2 * rem:])
    return ([([(e, o, S) for e, o in pairs], S)], [([(o, e, S) for e, o in pairs], 0.0)],
            survivors)


def recursive_doubling_steps(ranks, S):
    """log2 p' swaps of the whole buffer with partners at distance 1, 2, 4, ..."""
    fold_in, fold_out, live = _fold_steps(ranks, S)
    steps, mask = [], 1
    while mask < len(live):
        steps.append(([(live[i], live[i ^ mask], S) for i in range(len(live))], S))
        mask <<= 1
    return fold_in + steps + fold_out


def rabenseifner_steps(ranks, S):
    """Recursive halving (distance p'/2 first, halves of the window) then doubling back."""
    fold_in, fold_out, live = _fold_steps(ranks, S)
    p2 = len(live)
    halving, mask, part = [], p2 >> 1, S / 2
    while mask:
        halving.append(([(live[i], live[i ^ mask], part) for i in range(p2)], part))
        mask, part = mask >> 1, part / 2
    doubling = [(msgs, 0.0) for msgs, _ in reversed(halving)]
    return fold_in + halving + doubling + fold_out


def tree_steps(ranks, S):
    """Binomial reduce to ranks[0] (distance 1, 2, 4, ...) then binomial broadcast back."""
    p = len(ranks)
    reduce_steps, mask = [], 1
    while mask < p:
        msgs = [(ranks[v], ranks[v - mask], S) for v in range(p) if v & mask and not v & (mask - 1)]
        reduce_steps.append((msgs, S))
        mask <<= 1
    broadcast = [([(dst, src, n) for src, dst, n in msgs], 0.0) for msgs, _ in reversed(reduce_steps)]
    return reduce_steps + broadcast


def at_once(step_lists):
    """Several groups' steps run side by side: step i of all of them is one step."""
    step_lists = [s for s in step_lists if s]
    n = max((len(s) for s in step_lists), default=0)
    return [(sum((s[i][0] for s in step_lists if i < len(s)), []),
             max(s[i][1] for s in step_lists if i < len(s))) for i in range(n)]


def hierarchical_steps(ranks, S, q, inner="ring"):
    """Reduce-scatter inside each node, all-reduce of each shard across nodes (the q
    cross groups at once), all-gather inside each node.  Nodes of unequal size: reduce
    to each node's first rank, all-reduce among those, broadcast back (binomial)."""
    nodes = [ranks[i:i + q] for i in range(0, len(ranks), q)]
    if len(nodes[-1]) != q:
        trees = [tree_steps(node, S) for node in nodes]          # reduce steps, then broadcast
        up = at_once([t[:len(t) // 2] for t in trees])
        down = at_once([t[len(t) // 2:] for t in trees])
        return up + STEPS[inner]([node[0] for node in nodes], S) + down
    inside = at_once([ring_steps(node, S) for node in nodes])
    half = len(inside) // 2
    across = at_once([STEPS[inner]([node[j] for node in nodes], S / q) for j in range(q)])
    return inside[:half] + across + inside[half:]


STEPS = {"ring": ring_steps, "recursive_doubling": recursive_doubling_steps,
         "rabenseifner": rabenseifner_steps, "tree": tree_steps}


# ------------------------------------------------------------------ pricing
def step_seconds(messages, reduced, q, c, seg=SEGMENT_BYTES, credit=None):
    """One step's time: its slowest message, or its busiest node link (see the module).
    ``credit``: {link: bytes} a shaped link may still pass at once (``burst_inter``),
    spent by this step's bytes and earned back while the link idles in it."""
    slowest = 0.0
    load = defaultdict(float)            # bytes through ("out", node) and ("in", node)
    for src, dst, n in messages:
        k = segments(n, seg)
        if src // q == dst // q:
            slowest = max(slowest, k * c.alpha + n * beta_of(c, n))
        else:
            load["out", src // q] += n
            load["in", dst // q] += n
            free = min(credit["out", src // q], credit["in", dst // q]) if credit else 0.0
            slowest = max(slowest, k * c.alpha_inter + max(n - free, 0.0) * c.beta_inter)
    busy = {link: max(n - (credit[link] if credit else 0.0), 0.0) * c.beta_inter
            for link, n in load.items()}
    if busy:
        slowest = max(slowest, c.alpha_inter + max(busy.values()))
    took = slowest + reduced * gamma_of(c, reduced)
    if credit is not None:                # what is left, plus the rate while not sending
        for link in credit:
            left = max(credit[link] - load.get(link, 0.0), 0.0)
            earned = (took - busy.get(link, 0.0)) / c.beta_inter
            credit[link] = min(left + earned, c.burst_inter)
    return took


def refill_seconds(c):
    """Seconds of idle that refill a shaped link's bucket twice over (2·B·β_out; 0
    without a burst): what ``bench comm`` and ``measure_winners``
    (``perf/calibrate_links.py``) sleep before each call, so every call starts as
    ``predict`` assumes."""
    return 2 * c.burst_inter * c.beta_inter if c.burst_inter and c.beta_inter else 0.0


def steps_of(algorithm, p, nbytes, q):
    ranks = list(range(p))
    if algorithm == "hierarchical":
        return hierarchical_steps(ranks, float(nbytes), min(q, p))
    if algorithm.startswith("hierarchical:"):
        return hierarchical_steps(ranks, float(nbytes), min(q, p), algorithm.split(":", 1)[1])
    return STEPS[algorithm](ranks, float(nbytes))


def price(steps, p, q, c, seg=SEGMENT_BYTES):
    """Seconds of ``steps`` over ranks 0..p-1, nodes of ``q`` ranks, one after another;
    every node's links start idle (a full burst, where the link has one)."""
    credit = None
    if c.burst_inter:
        credit = {(way, node): c.burst_inter for way in ("out", "in") for node in range(-(-p // q))}
    return sum(step_seconds(m, r, q, c, seg, credit) for m, r in steps)


def predict(algorithm, p, nbytes, c, q, seg=SEGMENT_BYTES):
    """Seconds of an all-reduce of ``nbytes`` over ranks 0..p-1, nodes of ``q`` ranks."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return price(steps_of(algorithm, p, nbytes, q), p, q, c, seg)


def bytes_sent(algorithm, p, nbytes, q=None):
    """Bytes each rank sends in total, by rank (what the traffic counters count)."""
    sent = defaultdict(float)
    for msgs, _ in steps_of(algorithm, p, nbytes, q or p):
        for src, _, n in msgs:
            sent[src] += n
    return [sent[r] for r in range(p)]


def crosses_nodes(p, q):
    return bool(q) and 0 < q < p and math.ceil(p / q) > 1


# ------------------------------------------------------------------ all-to-all
# ``sizes[s][d]``: the bytes rank s sends rank d.  A step's "reduced" bytes are here the
# bytes a rank copies locally (its own block, or packing rows for the next phase): a copy
# streams them through memory once, as a reduction does, so γ prices it.

def pairwise_all_to_all_steps(sizes):
    """Round k = 1..p-1: every rank r sends its block for (r+k) mod p (empty ones are not
    sent); the first round also copies each rank's block for itself."""
    p = len(sizes)
    own = max(sizes[r][r] for r in range(p))
    return [([(r, (r + k) % p, sizes[r][(r + k) % p]) for r in range(p) if sizes[r][(r + k) % p]],
             own if k == 1 else 0.0) for k in range(1, p)]


def two_level_all_to_all_steps(sizes, q):
    """Nodes of ``q`` consecutive ranks, rank (a, j) = a·q + j.  Inside each node (q-1
    rounds): (a, j) hands local rank t its rows for local rank t of every node, after
    packing its whole buffer by column.  Across nodes (m-1 rounds): (a, j) sends (b, j)
    the rows of all of node a for (b, j), after packing what the first phase left it."""
    p = len(sizes)
    m = p // q

    def rank(a, j):
        return a * q + j
    packed = max(sum(row) for row in sizes)
    held = max(sum(sizes[rank(a, s)][rank(b, j)] for s in range(q) for b in range(m))
               for a in range(m) for j in range(q))
    inside = [([(rank(a, j), rank(a, (j + k) % q),
                 sum(sizes[rank(a, j)][rank(b, (j + k) % q)] for b in range(m)))
                for a in range(m) for j in range(q)], packed if k == 1 else 0.0)
              for k in range(1, q)]
    across = [([(rank(a, j), rank((a + k) % m, j),
                 sum(sizes[rank(a, s)][rank((a + k) % m, j)] for s in range(q)))
                for a in range(m) for j in range(q)], held if k == 1 else 0.0)
              for k in range(1, m)]
    return [([msg for msg in msgs if msg[2]], copied) for msgs, copied in inside + across]


def all_to_all_steps(algorithm, sizes, q):
    """The steps of ``algorithm`` ("pairwise" or "two_level") for the byte matrix ``sizes``.
    Two levels need nodes of equal size, more than one node and more than one rank per
    node; otherwise the collective runs the pairwise exchange, and so does this."""
    p = len(sizes)
    if algorithm == "two_level" and 1 < q < p and p % q == 0:
        return two_level_all_to_all_steps(sizes, q)
    return pairwise_all_to_all_steps(sizes)


def predict_all_to_all(algorithm, p, nbytes, c, q, seg=SEGMENT_BYTES):
    """Seconds of an all-to-all over ranks 0..p-1 (nodes of ``q``) in which every rank
    sends ``nbytes``, nbytes/p to each rank (itself included).  Two examples, p = 4,
    q = 2 (nodes {0, 1} and {2, 3}), no burst, unsegmented messages:

        pairwise   3·α_out + S·β_out + S/4·γ(S/4)
                   (rounds 1 and 3 send S/4 through each node's link, round 2 S/2)
        two_level  α + S/2·β(S/2) + α_out + S·β_out + 2·S·γ(S)
                   (inside: one swap of S/2; across: both ranks' S/2 through one link)
    """
    if p <= 1 or nbytes <= 0:
        return 0.0
    block = float(nbytes) / p
    sizes = [[block] * p for _ in range(p)]
    return price(all_to_all_steps(algorithm, sizes, q), p, q, c, seg)
