"""Context parallelism's price: each rank's share of the layer, and the ring's and Ulysses' traffic.

cp = C ranks split each sequence of S tokens; with ``cp_kind`` ulysses, groups of U of
them run Ulysses and the R = C/U groups a ring (U = 1: the ring alone, R = 1: Ulysses
alone; ``parallel/context/ulysses.py``).  A rank holds b sequences of S/C tokens, so
every token-wise op of a layer (the weight GEMMs, norms, the MLP; the head and the
embeddings) is priced on S/C tokens.  Attention, on a/(t·U) heads of a tp rank's a/t:

    R = 1    one attention over all S positions (Ulysses' heads, whole)
    R > 1    the ring's chunk pairs: with the zig-zag split 2R+1 pairs of c = S/(2R)
             queries and keys each (2R-1 unmasked pairs and 2 diagonal ones, each of
             which the kernels compute whole), with the contiguous split the busiest
             rank's 4R-1 pairs (2 of them diagonal); each pair priced by the profile's
             ring-pair curve (``ring_pair_seconds``: the pair's own ops, merge and
             accumulation), else as an attention over c positions

Communication per layer, on the critical path (e bytes a number, d = h/a, Hkv' =
max(Hkv/t, U) the key/value heads that travel, n = S/C):

    Ulysses   forward  one all-to-all of (a/t + 2·Hkv')·b·n·d·e bytes (q, k, v) and one of
                       a/t·b·n·d·e (the output); backward the same two.  Nothing overlaps.
              Priced by the comm package's own model (``comm.cost_model.predict_all_to_all``,
              the cheaper of its algorithms, as ``all_to_all(algorithm="auto")`` runs)
              where the profile carries its constants, else (U-1)·α + (U-1)/U·bytes/B.
    ring      forward  R-1 hops of the K,V block, 2·b·(Hkv'/U)·(S/R)·d·e bytes, each
                       overlapped with one hop's share of the pairs: max(0, hop - pairs/R);
              backward the same hops overlapped alike, then R hops of the dK,dV
                       accumulator (the same bytes) that nothing overlaps.

A hop goes to the next ring rank (stride t·U in the grid), an all-to-all within a group
of U ranks at stride t: where such a group spans nodes, the slow link prices it, and a
hop that crosses it shares it with the other rings' hops crossing at the same moment
(``crossing_flows``: the hybrid's U rings cross together, so each gets 1/U of the link).
"""
from __future__ import annotations

import dataclasses

from minipar.perf.comm import Cyclic, collective_seconds, placement

ALL_TO_ALL_ALGORITHMS = ("pairwise", "two_level")


def ulysses_degree(config):
    """U: the Ulysses group's size (1 for the ring)."""
    if config.cp_kind != "ulysses":
        return 1
    return config.cp_ulysses or config.cp


def local_shape(x, cp):
    """The LayerShape of the S/C tokens a cp rank holds."""
    return dataclasses.replace(x, s=x.s // cp)


def attention_core_seconds(prof, x, config):
    """(forward, backward) seconds of one rank's attention core under context parallelism
    (``x``: the layer's shape over the whole sequence)."""
    from minipar.perf.compute import attention_core_s
    cp, ulysses = config.cp, ulysses_degree(config)
    ring = cp // ulysses
    heads = dataclasses.replace(x, t=x.t * ulysses)      # a/(t·U) heads, the same d
    if ring == 1:
        return attention_core_s(prof, heads)
    pairs = 2 * ring + 1 if config.cp_split == "zigzag" else 4 * ring - 1
    f, b, f_diag, b_diag = ring_pair_seconds(prof, dataclasses.replace(heads, s=x.s // (2 * ring)))
    return (pairs - 2) * f + 2 * f_diag, (pairs - 2) * b + 2 * b_diag


def ring_pair_seconds(prof, pair):
    """(forward, backward, forward on the diagonal, backward on the diagonal) seconds of
    one ring-attention chunk pair of ``pair.s`` queries and keys: the profile's
    ``ring:<kind>:<dtype>`` curve (``calibrate_attention.ring_pair_curve``: the pair's
    own array ops, merge and accumulation), else an attention over ``pair.s`` positions
    (flash pairs run the model's kernels; profiles without the curve)."""
    from minipar.perf.compute import attention_core_s
    from minipar.perf.profile import interp_loglog
    curve = prof.attention.get(f"ring:{pair.attention}:{pair.dtype}")
    if not curve:
        f, b = attention_core_s(prof, pair)
        return f, b, f, b
    size = pair.b * max(pair.a // pair.t, 1) * pair.s * pair.s * (pair.h // pair.a)
    return tuple(interp_loglog([[p[0], p[i]] for p in curve], size) for i in range(1, 5))


def all_to_all_seconds(prof, p, nbytes, stride, ranks_per_node):
    """One all-to-all in which each of ``p`` ranks (``stride`` apart) sends ``nbytes``."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    where = placement(p, stride, ranks_per_node)
    if prof.cost_params:
        from minipar.comm.cost_model import predict_all_to_all
        from minipar.comm.cost_params import CostParams
        c = CostParams.from_dict(prof.cost_params)
        q = max(min(p, int(ranks_per_node) // max(stride, 1)), 1)
        return min(predict_all_to_all(name, p, nbytes, c, q) for name in ALL_TO_ALL_ALGORITHMS)
    alpha, bw = prof.link(where)
    return (p - 1) * alpha + (p - 1) / p * nbytes / bw


def crossing_flows(stride, ranks_per_node):
    """How many of a node's ranks send a ring hop off the node at once, sharing its link:
    the ring runs ``stride`` rings side by side (one per offset), and with the ranks in
    blocks of ``ranks_per_node`` the last min(stride, n) ranks of each node have their
    next ring member on the next node (the hybrid's U ranks of a Ulysses group, one per
    ring, all cross together); dealt round the nodes (``Cyclic``), every rank's next
    member is elsewhere."""
    n = max(int(ranks_per_node), 1)
    return n if isinstance(ranks_per_node, Cyclic) else min(max(stride, 1), n)


def comm_seconds_per_layer(prof, x, config, ranks_per_node, compute_scale=1.0):
    """(forward, backward) seconds of one layer's context-parallel communication on the
    critical path (the docstring's formulas); ``x`` over the whole sequence;
    ``compute_scale``: the factor on the profile's compute seconds (``estimate.predict``'s
    model scale and core sharing), for the attention the ring's hops hide behind."""
    core_f, core_b = (compute_scale * s for s in attention_core_seconds(prof, x, config))
    cp, ulysses, t = config.cp, ulysses_degree(config), x.t
    ring = cp // ulysses
    d, e = x.h // x.a, x.e
    heads = max(x.a // t, 1)
    kv_heads = max(max((x.kv or x.a) // t, 1), ulysses)
    n = x.s // cp
    forward = backward = 0.0
    if ulysses > 1:
        qkv = all_to_all_seconds(prof, ulysses, (heads + 2 * kv_heads) * x.b * n * d * e, t,
                                 ranks_per_node)
        out = all_to_all_seconds(prof, ulysses, heads * x.b * n * d * e, t, ranks_per_node)
        forward += qkv + out
        backward += qkv + out
    if ring > 1:
        block = 2 * x.b * (kv_heads // ulysses) * (x.s // ring) * d * e
        where = placement(ring, t * ulysses, ranks_per_node)
        flows = crossing_flows(t * ulysses, ranks_per_node) if where == "inter" else 1
        hop = collective_seconds(prof, "p2p", 2, flows * block, where)
        forward += (ring - 1) * max(hop - core_f / ring, 0.0)
        backward += (ring - 1) * max(hop - core_b / ring, 0.0) + ring * hop
    return forward, backward


def sent_bytes_per_layer(x, config):
    """Bytes one rank sends per layer, forward and backward (the shared-core bound's
    sent_r, ``host.py``): ``ulysses.bytes_per_rank``, the formula the transport's
    counters are checked against."""
    from minipar.parallel.context.ulysses import bytes_per_rank
    t = x.t
    return bytes_per_rank(x.b, max(x.a // t, 1), max((x.kv or x.a) // t, 1), x.s, x.h // x.a,
                          x.e, config.cp, ulysses_degree(config))


def layer_time(prof, x, config):
    """``compute.layer_time`` of a cp rank: its S/C tokens, and its attention core
    (``attention_core_seconds``) in place of an attention over S/C positions.  ``x``:
    the layer's shape over the whole sequence."""
    from minipar.perf.compute import LayerTime, attention_core_s, layer_time as whole_layer_time
    mine = local_shape(x, config.cp)
    lt = whole_layer_time(prof, mine, config.recompute)
    local_f, local_b = attention_core_s(prof, mine)
    core_f, core_b = attention_core_seconds(prof, x, config)
    forward = lt.forward - local_f + core_f
    redo = {"none": 0.0, "full": forward, "selective": core_f}[config.recompute]
    return LayerTime(forward, lt.backward_input - local_b + core_b, lt.backward_weight, redo)
